#include "modules/hf_config.h"

#include <charconv>
#include <set>
#include <vector>

#include <glog/logging.h>

namespace moe {
namespace {

struct TypeNames {
  HfModelType type;
  const char* model_type;
  const char* architecture;
};
constexpr TypeNames kTypes[] = {{HfModelType::kQwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM"},
                                {HfModelType::kMixtral, "mixtral", "MixtralForCausalLM"},
                                {HfModelType::kOlmoe, "olmoe", "OlmoeForCausalLM"}};

const TypeNames& NamesOf(HfModelType type) {
  const TypeNames& names = kTypes[static_cast<size_t>(type)];
  CHECK(names.type == type) << "kTypes is in HfModelType's order";
  return names;
}

// The double whose shortest decimal is the float's: 1e-06, not 9.999999974752427e-07.
double ShortestDouble(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  double out = 0;
  std::from_chars(buffer, result.ptr, out);
  return out;
}

// Reads config.json's fields; every error is one line naming the field.
class Fields {
 public:
  explicit Fields(const nlohmann::json& config) : config_(config) {}

  bool Has(const char* key) const { return config_.contains(key) && !config_[key].is_null(); }
  const nlohmann::json& At(const char* key) const { return config_[key]; }

  StatusOr<int64_t> Integer(const char* key, std::optional<int64_t> fallback = {}) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return InvalidArgument("config.json has no \"" + std::string(key) + "\"");
    }
    const nlohmann::json& v = config_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      return InvalidArgument("config.json: \"" + std::string(key) + "\" is " + v.dump() +
                             ", not an integer >= 1");
    }
    return v.get<int64_t>();
  }
  StatusOr<double> Number(const char* key, std::optional<double> fallback = {}) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return InvalidArgument("config.json has no \"" + std::string(key) + "\"");
    }
    if (!config_[key].is_number()) {
      return InvalidArgument("config.json: \"" + std::string(key) + "\" is " + config_[key].dump() +
                             ", not a number");
    }
    return config_[key].get<double>();
  }
  // A number in (0, max]: an epsilon, a rotary base.
  StatusOr<double> PositiveNumber(const char* key, double max) const {
    MOE_ASSIGN_OR_RETURN(const double value, Number(key));
    if (!(value > 0 && value <= max)) {
      return InvalidArgument("config.json: \"" + std::string(key) + "\" is " + config_[key].dump() +
                             ", not a number in (0, " + nlohmann::json(max).dump() + "]");
    }
    return value;
  }
  StatusOr<bool> Boolean(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!config_[key].is_boolean()) {
      return InvalidArgument("config.json: \"" + std::string(key) + "\" is " + config_[key].dump() +
                             ", not true or false");
    }
    return config_[key].get<bool>();
  }
  // A field the trainer cannot represent unless it is absent, null or `allowed`.
  Status Refuse(const char* key, const nlohmann::json& allowed, const std::string& why) const {
    if (!Has(key) || config_[key] == allowed) return Status::Ok();
    return InvalidArgument("config.json: \"" + std::string(key) + "\" " + config_[key].dump() +
                           " is not supported: " + why);
  }

 private:
  const nlohmann::json& config_;
};

// moe_train's range of --rotary_base (its flag table) is (0, 1e12].
constexpr double kMaxRotaryBase = 1e12;

// The rotary base: rope_parameters (transformers 5) or rope_theta (4); refuses scaling.
StatusOr<double> RotaryBase(const Fields& f, HfModelType type) {
  std::optional<double> base;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!f.Has(key)) continue;
    const nlohmann::json& rope = f.At(key);
    if (!rope.is_object()) {
      return InvalidArgument("config.json: \"" + std::string(key) + "\" " + rope.dump() +
                             " is not supported: RoPE scaling (the trainer's RoPE is unscaled)");
    }
    for (const auto& [name, value] : rope.items()) {
      const bool plain_type = (name == "rope_type" || name == "type") && value == "default";
      if (plain_type) continue;
      if (name == "rope_theta" && value.is_number()) {
        base = value.get<double>();
        if (!(*base > 0 && *base <= kMaxRotaryBase)) {
          return InvalidArgument("config.json: \"" + std::string(key) + "\" rope_theta " +
                                 value.dump() + " is not a number in (0, 1e12]");
        }
        continue;
      }
      return InvalidArgument("config.json: \"" + std::string(key) + "\" {\"" + name +
                             "\": " + value.dump() +
                             "} is not supported: RoPE scaling (the trainer's RoPE is "
                             "unscaled; only rope_type \"default\" and rope_theta)");
    }
  }
  if (f.Has("rope_theta")) {
    MOE_ASSIGN_OR_RETURN(const double top, f.PositiveNumber("rope_theta", kMaxRotaryBase));
    if (base && *base != top) {
      return InvalidArgument("config.json: \"rope_theta\" " + f.At("rope_theta").dump() +
                             " and rope_parameters' rope_theta " + nlohmann::json(*base).dump() +
                             " disagree");
    }
    base = top;
  }
  return base.value_or(type == HfModelType::kMixtral ? 1e6 : 10000.0);
}

StatusOr<int64_t> ExpertCount(const Fields& f) {
  std::optional<int64_t> count;
  for (const char* key : {"num_experts", "num_local_experts"}) {
    if (!f.Has(key)) continue;
    MOE_ASSIGN_OR_RETURN(const int64_t n, f.Integer(key));
    if (count && *count != n) {
      return InvalidArgument("config.json: \"num_experts\" " + std::to_string(*count) +
                             " and \"num_local_experts\" " + std::to_string(n) + " disagree");
    }
    count = n;
  }
  if (!count)
    return InvalidArgument("config.json has no \"num_experts\" (or \"num_local_experts\")");
  return *count;
}

// qwen3_moe's dense layers: those in mlp_only_layers, and those decoder_sparse_step skips. They
// must be the first ones: returns how many.
StatusOr<int64_t> Qwen3DenseLayers(const Fields& f, int64_t layers) {
  std::set<int64_t> dense;
  if (f.Has("mlp_only_layers")) {
    const nlohmann::json& list = f.At("mlp_only_layers");
    if (!list.is_array()) {
      return InvalidArgument("config.json: \"mlp_only_layers\" " + list.dump() +
                             " is not a list of layer indices");
    }
    for (const nlohmann::json& i : list) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= layers) {
        return InvalidArgument("config.json: \"mlp_only_layers\" " + list.dump() + " holds " +
                               i.dump() + ", not a layer index below " + std::to_string(layers));
      }
      dense.insert(i.get<int64_t>());
    }
  }
  MOE_ASSIGN_OR_RETURN(const int64_t step, f.Integer("decoder_sparse_step", 1));
  for (int64_t i = 0; i < layers; ++i) {
    if ((i + 1) % step != 0) dense.insert(i);
  }
  const int64_t count = static_cast<int64_t>(dense.size());
  if (count > 0 && *dense.rbegin() != count - 1) {
    std::string list;
    for (int64_t i : dense) list += (list.empty() ? "" : ", ") + std::to_string(i);
    return InvalidArgument("config.json: dense layers " + list + " (\"mlp_only_layers\" " +
                           (f.Has("mlp_only_layers") ? f.At("mlp_only_layers").dump() : "[]") +
                           ", \"decoder_sparse_step\" " + std::to_string(step) +
                           ") are not supported: the trainer's dense layers are the first ones "
                           "(--first_dense_layers)");
  }
  return count;
}

}  // namespace

const char* HfModelTypeName(HfModelType type) { return NamesOf(type).model_type; }
const char* HfArchitecture(HfModelType type) { return NamesOf(type).architecture; }

std::optional<HfModelType> HfModelTypeNamed(const std::string& name) {
  for (const TypeNames& t : kTypes) {
    if (name == t.model_type) return t.type;
  }
  return std::nullopt;
}

StatusOr<HfModel> HfModelFromConfig(const nlohmann::json& config) {
  if (!config.is_object()) return InvalidArgument("config.json is not a JSON object");
  const Fields f(config);
  if (!f.Has("model_type") || !f.At("model_type").is_string()) {
    return InvalidArgument("config.json has no string \"model_type\"");
  }
  const std::string model_type = f.At("model_type").get<std::string>();
  const std::optional<HfModelType> type = HfModelTypeNamed(model_type);
  if (!type) {
    return InvalidArgument("config.json: \"model_type\" \"" + model_type +
                           "\" is not supported (hf_convert reads " + kHfModelTypeNames + ")");
  }
  const nlohmann::json architectures = nlohmann::json::array({HfArchitecture(*type)});
  if (f.Has("architectures") && f.At("architectures") != architectures) {
    return InvalidArgument("config.json: \"architectures\" " + f.At("architectures").dump() +
                           " is not supported: a " + model_type + " checkpoint is " +
                           architectures.dump());
  }
  MOE_RETURN_IF_ERROR(f.Refuse("tie_word_embeddings", false,
                               "the trainer's LM head is a weight of its own (untied)"));
  MOE_RETURN_IF_ERROR(f.Refuse("attention_bias", false, "the trainer's projections have no bias"));
  MOE_RETURN_IF_ERROR(f.Refuse("hidden_act", "silu", "the trainer's MLPs are SwiGLU (silu)"));
  MOE_RETURN_IF_ERROR(f.Refuse("attention_dropout", 0.0, "the trainer has no dropout"));
  MOE_RETURN_IF_ERROR(f.Refuse("router_jitter_noise", 0.0, "the trainer's router has no noise"));
  MOE_RETURN_IF_ERROR(f.Refuse("clip_qkv", nullptr, "the trainer does not clip q, k and v"));
  if (*type == HfModelType::kQwen3Moe) {
    MOE_RETURN_IF_ERROR(
        f.Refuse("use_sliding_window", false, "the trainer's attention is full causal attention"));
  } else {
    MOE_RETURN_IF_ERROR(
        f.Refuse("sliding_window", nullptr, "the trainer's attention is full causal attention"));
  }

  HfModel out{*type, GptConfig(), 0};
  GptConfig& c = out.config;
  MOE_ASSIGN_OR_RETURN(c.num_layers, f.Integer("num_hidden_layers"));
  MOE_ASSIGN_OR_RETURN(c.hidden_size, f.Integer("hidden_size"));
  MOE_ASSIGN_OR_RETURN(c.num_attention_heads, f.Integer("num_attention_heads"));
  MOE_ASSIGN_OR_RETURN(c.num_query_groups, f.Integer("num_key_value_heads", c.num_attention_heads));
  MOE_ASSIGN_OR_RETURN(c.vocab_size, f.Integer("vocab_size"));
  MOE_ASSIGN_OR_RETURN(out.max_position_embeddings, f.Integer("max_position_embeddings"));
  if (!f.Has("head_dim") && c.hidden_size % c.num_attention_heads != 0) {
    return InvalidArgument("config.json: \"hidden_size\" " + std::to_string(c.hidden_size) +
                           " is not a multiple of \"num_attention_heads\" " +
                           std::to_string(c.num_attention_heads) + " and there is no \"head_dim\"");
  }
  MOE_ASSIGN_OR_RETURN(c.kv_channels, f.Integer("head_dim", c.hidden_size / c.num_attention_heads));
  MOE_ASSIGN_OR_RETURN(const double epsilon, f.PositiveNumber("rms_norm_eps", 1.0));
  c.norm_epsilon = static_cast<float>(epsilon);
  MOE_ASSIGN_OR_RETURN(const double base, RotaryBase(f, *type));
  c.rotary_base = static_cast<float>(base);
  MOE_ASSIGN_OR_RETURN(c.num_experts, ExpertCount(f));
  MOE_ASSIGN_OR_RETURN(c.moe_router_topk, f.Integer("num_experts_per_tok"));
  MOE_ASSIGN_OR_RETURN(const bool renormalise,
                       f.Boolean("norm_topk_prob", *type == HfModelType::kMixtral));
  c.moe_router_pre_softmax = *type != HfModelType::kMixtral && !renormalise;
  c.first_dense_layers = 0;
  switch (*type) {
    case HfModelType::kQwen3Moe: {
      c.qk_layernorm = true;
      MOE_ASSIGN_OR_RETURN(c.moe_ffn_hidden_size, f.Integer("moe_intermediate_size"));
      MOE_ASSIGN_OR_RETURN(c.first_dense_layers, Qwen3DenseLayers(f, c.num_layers));
      if (c.first_dense_layers > 0) {
        MOE_ASSIGN_OR_RETURN(c.ffn_hidden_size, f.Integer("intermediate_size"));
      }
      break;
    }
    case HfModelType::kMixtral: {
      MOE_ASSIGN_OR_RETURN(c.moe_ffn_hidden_size, f.Integer("intermediate_size"));
      break;
    }
    case HfModelType::kOlmoe: {
      c.qk_layernorm = true;
      c.qk_layernorm_across_heads = true;
      MOE_ASSIGN_OR_RETURN(c.moe_ffn_hidden_size, f.Integer("intermediate_size"));
      if (c.q_dim() != c.hidden_size) {
        return InvalidArgument("config.json: \"head_dim\" " + std::to_string(c.head_dim()) + " x " +
                               std::to_string(c.num_attention_heads) +
                               " heads is not supported: OLMoE's q_norm spans hidden_size " +
                               std::to_string(c.hidden_size) +
                               ", so the query projection must be that wide");
      }
      break;
    }
  }
  return out;
}

HfModelType DefaultHfModelType(const GptConfig& config) {
  if (!config.qk_layernorm) return HfModelType::kMixtral;
  return config.qk_layernorm_across_heads ? HfModelType::kOlmoe : HfModelType::kQwen3Moe;
}

StatusOr<nlohmann::json> HfConfigFor(const GptConfig& c, HfModelType type,
                                     const std::string& dtype_name) {
  const std::string name = HfModelTypeName(type);
  const auto cannot = [&](const std::string& what) {
    return InvalidArgument("--model_type=" + name + " cannot express " + what);
  };
  const int64_t dense = std::min(c.num_layers, c.first_dense_layers);
  const bool per_head_norm = c.qk_layernorm && !c.qk_layernorm_across_heads;
  const bool across_norm = c.qk_layernorm && c.qk_layernorm_across_heads;
  switch (type) {
    case HfModelType::kQwen3Moe:
      if (!per_head_norm) {
        return cannot(
            std::string("a model ") +
            (across_norm ? "whose query/key norm spans all heads" : "without query/key norm") +
            " (Qwen3-MoE normalises each head: --qk_layernorm, not across heads)");
      }
      break;
    case HfModelType::kMixtral:
      if (c.qk_layernorm) return cannot("--qk_layernorm (Mixtral has no query/key norm)");
      if (c.moe_router_pre_softmax) {
        return cannot("--moe_router_pre_softmax (Mixtral renormalises its top-k probabilities)");
      }
      if (dense > 0) {
        return cannot("--first_dense_layers=" + std::to_string(dense) +
                      " (every Mixtral layer is MoE)");
      }
      break;
    case HfModelType::kOlmoe:
      if (!across_norm) {
        return cannot(
            "a model without --qk_layernorm_across_heads (OLMoE's query/key norms "
            "span all heads)");
      }
      if (dense > 0) {
        return cannot("--first_dense_layers=" + std::to_string(dense) +
                      " (every OLMoE layer is MoE)");
      }
      if (c.q_dim() != c.hidden_size) {
        return cannot("a query projection of " + std::to_string(c.q_dim()) +
                      " (--kv_channels x --num_attention_heads) on --hidden_size=" +
                      std::to_string(c.hidden_size) + " (OLMoE's q_norm spans hidden_size)");
      }
      break;
  }
  const double base = ShortestDouble(c.rotary_base);
  nlohmann::json j = {
      {"architectures", {HfArchitecture(type)}},
      {"model_type", name},
      {"dtype", dtype_name},
      {"torch_dtype", dtype_name},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_query_groups},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.seq_length},
      {"initializer_range", ShortestDouble(c.init_std)},
      {"rms_norm_eps", ShortestDouble(c.norm_epsilon)},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", base}}},
      {"rope_theta", base},
      {"tie_word_embeddings", false},
      {"use_cache", true},
      {"attention_dropout", 0.0},
      {"num_experts_per_tok", c.moe_router_topk},
      {"output_router_logits", false},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"pad_token_id", nullptr},
  };
  switch (type) {
    case HfModelType::kQwen3Moe: {
      std::vector<int64_t> dense_layers;
      for (int64_t i = 0; i < dense; ++i) dense_layers.push_back(i);
      j["head_dim"] = c.head_dim();
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
      j["intermediate_size"] = dense > 0 ? c.ffn_hidden_size : c.moe_ffn_hidden_size;
      j["mlp_only_layers"] = dense_layers;
      j["decoder_sparse_step"] = 1;
      j["norm_topk_prob"] = !c.moe_router_pre_softmax;
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["router_aux_loss_coef"] = 0.001;
      break;
    }
    case HfModelType::kMixtral:
      j["head_dim"] = c.head_dim();
      j["num_local_experts"] = c.num_experts;
      j["intermediate_size"] = c.moe_ffn_hidden_size;
      j["sliding_window"] = nullptr;
      j["router_jitter_noise"] = 0.0;
      j["router_aux_loss_coef"] = 0.001;
      break;
    case HfModelType::kOlmoe:
      j["num_experts"] = c.num_experts;
      j["intermediate_size"] = c.moe_ffn_hidden_size;
      j["norm_topk_prob"] = !c.moe_router_pre_softmax;
      j["attention_bias"] = false;
      j["clip_qkv"] = nullptr;
      j["router_aux_loss_coef"] = 0.01;
      break;
  }
  return j;
}

}  // namespace moe
