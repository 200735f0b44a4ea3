#include "modules/model_shape.h"

namespace moe {

nlohmann::json ModelShapeJson(const GptConfig& c) {
  return {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_query_groups", c.num_query_groups},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"num_experts", c.num_experts},
          {"moe_router_topk", c.moe_router_topk},
          {"moe_ffn_hidden_size", c.moe_ffn_hidden_size},
          {"first_dense_layers", c.first_dense_layers},
          {"seq_length", c.seq_length},
          {"vocab_size", c.vocab_size}};
}

std::string ModelShapeDifferences(const nlohmann::json& saved, const GptConfig& config) {
  const bool dense = std::min(config.num_layers, config.first_dense_layers) > 0;
  const bool moe = config.num_moe_layers() > 0;
  const auto matters = [&](const std::string& key) {
    if (key == "ffn_hidden_size") return dense;
    if (key == "num_experts" || key == "moe_router_topk" || key == "moe_ffn_hidden_size") {
      return moe;
    }
    return true;
  };
  const nlohmann::json ours = ModelShapeJson(config);
  std::string out;
  const auto add = [&](const std::string& text) { out += (out.empty() ? "" : ", ") + text; };
  for (const auto& [key, value] : ours.items()) {
    if (!matters(key) || (saved.contains(key) && saved[key] == value)) continue;
    add("--" + key + " (checkpoint " + (saved.contains(key) ? saved[key].dump() : "none") +
        ", this run " + value.dump() + ")");
  }
  for (const auto& [key, value] : saved.items()) {
    if (!ours.contains(key)) add(key + " (checkpoint " + value.dump() + ", unknown to this build)");
  }
  return out;
}

}  // namespace moe
