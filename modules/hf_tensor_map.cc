#include "modules/hf_tensor_map.h"

#include "modules/transformer_layer.h"

namespace moe {
namespace {

constexpr const char* kStackedFc1 = "experts.gate_up_proj";

// The per-expert names of one MoE layer's expert e (prefix "model.layers.{i}.").
struct ExpertNames {
  std::string gate, up, down;
};
ExpertNames PerExpertNames(const std::string& prefix, HfModelType type, int64_t e) {
  const std::string expert = std::to_string(e);
  if (type == HfModelType::kMixtral) {
    const std::string base = prefix + "block_sparse_moe.experts." + expert + ".";
    return {base + "w1.weight", base + "w3.weight", base + "w2.weight"};
  }
  const std::string base = prefix + "mlp.experts." + expert + ".";
  return {base + "gate_proj.weight", base + "up_proj.weight", base + "down_proj.weight"};
}

}  // namespace

std::vector<HfTensorSlice> HfTensorSlices(const GptConfig& c, HfModelType type,
                                          HfExpertLayout layout) {
  const int64_t h = c.hidden_size;
  std::vector<HfTensorSlice> out;
  const auto add = [&](std::string hf_name, Shape shape, std::string ours, int64_t offset = 0) {
    out.push_back({std::move(hf_name), std::move(shape), std::move(ours), offset});
  };
  add("model.embed_tokens.weight", {c.vocab_size, h}, "embedding.weight");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string ours = LayerName(static_cast<int>(i)) + ".";
    add(hf + "input_layernorm.weight", {h}, ours + "attn_norm.weight");
    add(hf + "self_attn.q_proj.weight", {c.q_dim(), h}, ours + "attention.q_proj.weight");
    add(hf + "self_attn.k_proj.weight", {c.kv_dim(), h}, ours + "attention.k_proj.weight");
    add(hf + "self_attn.v_proj.weight", {c.kv_dim(), h}, ours + "attention.v_proj.weight");
    add(hf + "self_attn.o_proj.weight", {h, c.q_dim()}, ours + "attention.o_proj.weight");
    if (c.qk_layernorm) {
      const bool across = c.qk_layernorm_across_heads;
      add(hf + "self_attn.q_norm.weight", {across ? c.q_dim() : c.head_dim()},
          ours + "attention.q_norm.weight");
      add(hf + "self_attn.k_norm.weight", {across ? c.kv_dim() : c.head_dim()},
          ours + "attention.k_norm.weight");
    }
    add(hf + "post_attention_layernorm.weight", {h}, ours + "mlp_norm.weight");
    if (!c.is_moe_layer(i)) {
      const int64_t f = c.ffn_hidden_size;
      add(hf + "mlp.gate_proj.weight", {f, h}, ours + "mlp.fc1.weight");
      add(hf + "mlp.up_proj.weight", {f, h}, ours + "mlp.fc1.weight", f * h);
      add(hf + "mlp.down_proj.weight", {h, f}, ours + "mlp.fc2.weight");
      continue;
    }
    const int64_t e_count = c.num_experts, f = c.moe_ffn_hidden_size;
    const std::string router = ours + "moe.router.weight";
    const std::string fc1 = ours + "moe.experts.fc1.weight";
    const std::string fc2 = ours + "moe.experts.fc2.weight";
    if (layout == HfExpertLayout::kStacked) {
      add(hf + "mlp.gate.weight", {e_count, h}, router);
      add(hf + "mlp." + kStackedFc1, {e_count, 2 * f, h}, fc1);
      add(hf + "mlp.experts.down_proj", {e_count, h, f}, fc2);
      continue;
    }
    add(hf + (type == HfModelType::kMixtral ? "block_sparse_moe" : "mlp") + ".gate.weight",
        {e_count, h}, router);
    for (int64_t e = 0; e < e_count; ++e) {
      const ExpertNames names = PerExpertNames(hf, type, e);
      add(names.gate, {f, h}, fc1, e * 2 * f * h);
      add(names.up, {f, h}, fc1, e * 2 * f * h + f * h);
      add(names.down, {h, f}, fc2, e * h * f);
    }
  }
  add("model.norm.weight", {h}, "final_norm.weight");
  add("lm_head.weight", {c.vocab_size, h}, "lm_head.weight");
  return out;
}

HfExpertLayout HfExpertLayoutOf(const std::vector<std::string>& hf_names) {
  const std::string suffix = kStackedFc1;
  for (const std::string& name : hf_names) {
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return HfExpertLayout::kStacked;
    }
  }
  return HfExpertLayout::kPerExpert;
}

}  // namespace moe
