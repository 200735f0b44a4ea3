#include "modules/model_shape.h"

#include <charconv>

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

// Whether field `key` can change `config`'s model: not ffn_hidden_size without dense layers, nor
// the expert fields without MoE layers.
bool Matters(const std::string& key, const GptConfig& config) {
  if (key == "ffn_hidden_size") return std::min(config.num_layers, config.first_dense_layers) > 0;
  if (key == "num_experts" || key == "moe_router_topk" || key == "moe_ffn_hidden_size" ||
      key == "moe_router_pre_softmax") {
    return config.num_moe_layers() > 0;
  }
  return true;
}

// Whether field `key` sets a parameter's name or shape (the others change what the model computes
// with them).
bool SetsParameters(const std::string& key) {
  return key != "seq_length" && key != "rotary_base" && key != "norm_epsilon" &&
         key != "moe_router_topk" && key != "moe_router_pre_softmax";
}

}  // namespace

StatusOr<GptConfig> GptConfigFromModelShape(const nlohmann::json& saved_as_written) {
  if (!saved_as_written.is_object()) return DataLoss("the model shape is not a JSON object");
  const nlohmann::json saved = WithOlderDefaults(saved_as_written);
  GptConfig c;
  const auto integer = [&](const char* key, int64_t* field) -> Status {
    if (!saved.contains(key) || !saved[key].is_number_integer()) {
      return DataLoss(std::string("the model shape has no integer \"") + key + "\"");
    }
    *field = saved[key].get<int64_t>();
    return Status::Ok();
  };
  const auto boolean = [&](const char* key, bool* field) -> Status {
    if (!saved.contains(key) || !saved[key].is_boolean()) {
      return DataLoss(std::string("the model shape has no boolean \"") + key + "\"");
    }
    *field = saved[key].get<bool>();
    return Status::Ok();
  };
  const auto number = [&](const char* key, float* field) -> Status {
    if (!saved.contains(key) || !saved[key].is_number()) {
      return DataLoss(std::string("the model shape has no number \"") + key + "\"");
    }
    *field = saved[key].get<float>();
    return Status::Ok();
  };
  MOE_RETURN_IF_ERROR(integer("num_layers", &c.num_layers));
  MOE_RETURN_IF_ERROR(integer("hidden_size", &c.hidden_size));
  MOE_RETURN_IF_ERROR(integer("num_attention_heads", &c.num_attention_heads));
  MOE_RETURN_IF_ERROR(integer("num_query_groups", &c.num_query_groups));
  MOE_RETURN_IF_ERROR(integer("kv_channels", &c.kv_channels));
  MOE_RETURN_IF_ERROR(boolean("qk_layernorm", &c.qk_layernorm));
  MOE_RETURN_IF_ERROR(boolean("qk_layernorm_across_heads", &c.qk_layernorm_across_heads));
  MOE_RETURN_IF_ERROR(number("rotary_base", &c.rotary_base));
  MOE_RETURN_IF_ERROR(number("norm_epsilon", &c.norm_epsilon));
  MOE_RETURN_IF_ERROR(integer("ffn_hidden_size", &c.ffn_hidden_size));
  MOE_RETURN_IF_ERROR(integer("num_experts", &c.num_experts));
  MOE_RETURN_IF_ERROR(integer("moe_router_topk", &c.moe_router_topk));
  MOE_RETURN_IF_ERROR(integer("moe_ffn_hidden_size", &c.moe_ffn_hidden_size));
  MOE_RETURN_IF_ERROR(boolean("moe_router_pre_softmax", &c.moe_router_pre_softmax));
  MOE_RETURN_IF_ERROR(integer("first_dense_layers", &c.first_dense_layers));
  MOE_RETURN_IF_ERROR(integer("seq_length", &c.seq_length));
  MOE_RETURN_IF_ERROR(integer("vocab_size", &c.vocab_size));
  return c;
}

std::string ModelShapeFlagfile(const GptConfig& config) {
  const nlohmann::json fields = ModelShapeJson(config);
  std::string out;
  for (const auto& [key, value] : fields.items()) {
    if (!Matters(key, config)) continue;
    std::string text;
    if (value.is_number_float()) {  // the float the field holds, shortest
      char buffer[32];
      const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value.get<float>());
      text.assign(buffer, result.ptr);
    } else {
      text = value.dump();
    }
    out += "--" + key + "=" + text + "\n";
  }
  return out;
}

std::string ModelShapeDifferences(const nlohmann::json& saved_as_written, const GptConfig& config,
                                  ShapeFields compared) {
  const nlohmann::json saved = WithOlderDefaults(saved_as_written);
  const auto matters = [&](const std::string& key) {
    return Matters(key, config) && (compared == ShapeFields::kAll || SetsParameters(key));
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
