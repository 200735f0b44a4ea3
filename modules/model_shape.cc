#include "modules/model_shape.h"

namespace moe {

nlohmann::json ModelShapeJson(const GptConfig& c) {
  return {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_query_groups", c.num_query_groups},
          {"kv_channels", c.head_dim()},
          {"qk_layernorm", c.qk_layernorm},
          {"qk_layernorm_across_heads", c.qk_layernorm_across_heads},
          {"rotary_base", c.rotary_base},
          {"norm_epsilon", c.norm_epsilon},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"num_experts", c.num_experts},
          {"moe_router_topk", c.moe_router_topk},
          {"moe_ffn_hidden_size", c.moe_ffn_hidden_size},
          {"moe_router_pre_softmax", c.moe_router_pre_softmax},
          {"first_dense_layers", c.first_dense_layers},
          {"seq_length", c.seq_length},
          {"vocab_size", c.vocab_size}};
}

namespace {

// The fields added after checkpoints were first written.
constexpr const char* kLaterFields[] = {"kv_channels", "qk_layernorm", "qk_layernorm_across_heads",
                                        "rotary_base", "norm_epsilon", "moe_router_pre_softmax"};

// `saved` with the later fields it lacks at the values its build used: the head dimension hidden
// / heads, RoPE base 10000, epsilon 1e-5, no query/key norm, renormalised top-k gates.
nlohmann::json WithOlderDefaults(nlohmann::json saved) {
  GptConfig before;
  const nlohmann::json hidden = saved.value("hidden_size", nlohmann::json());
  const nlohmann::json heads = saved.value("num_attention_heads", nlohmann::json());
  if (hidden.is_number_integer() && heads.is_number_integer() && heads.get<int64_t>() > 0) {
    before.kv_channels = hidden.get<int64_t>() / heads.get<int64_t>();
  }
  const nlohmann::json values = ModelShapeJson(before);
  for (const char* key : kLaterFields) {
    if (!saved.contains(key)) saved[key] = values[key];
  }
  return saved;
}

}  // namespace

std::string ModelShapeDifferences(const nlohmann::json& saved_as_written, const GptConfig& config) {
  const nlohmann::json saved = WithOlderDefaults(saved_as_written);
  const bool dense = std::min(config.num_layers, config.first_dense_layers) > 0;
  const bool moe = config.num_moe_layers() > 0;
  const auto matters = [&](const std::string& key) {
    if (key == "ffn_hidden_size") return dense;
    if (key == "num_experts" || key == "moe_router_topk" || key == "moe_ffn_hidden_size" ||
        key == "moe_router_pre_softmax") {
      return moe;
    }
    return true;
  };
  const nlohmann::json ours = ModelShapeJson(config);
  std::string out;
  const auto add = [&](const std::string& text) { out += (out.empty() ? "" : ", ") + text; };
  for (const auto& [key, value] : ours.items()) {
    if (!matters(key) || (saved.contains(key) && saved[key] == value)) continue;
    if (key == "qk_layernorm_across_heads" && !config.qk_layernorm) continue;
    add("--" + key + " (checkpoint " + (saved.contains(key) ? saved[key].dump() : "none") +
        ", this run " + value.dump() + ")");
  }
  for (const auto& [key, value] : saved.items()) {
    if (!ours.contains(key)) add(key + " (checkpoint " + value.dump() + ", unknown to this build)");
  }
  return out;
}

}  // namespace moe
