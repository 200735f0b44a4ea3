#include "modules/model_presets.h"

#include <algorithm>

#include "engine/core/check.h"

namespace moe {
namespace {

// The 8-layer model at the Qwen3-30B-A3B MoE layer shape: 8 MoE layers, hidden 2048, 16 heads
// over 4 KV groups, 128 experts top-8, expert ffn 768, vocab 32000, sequence 4096.
GptConfig Qwen3Moe8Layer() {
  GptConfig c;
  c.num_layers = 8;
  c.first_dense_layers = 0;
  c.hidden_size = 2048;
  c.num_attention_heads = 16;
  c.num_query_groups = 4;
  c.num_experts = 128;
  c.moe_router_topk = 8;
  c.moe_ffn_hidden_size = 768;
  c.vocab_size = 32000;
  c.seq_length = 4096;
  return c;
}

// A 130M-parameter model for one GPU: 8 layers (1 dense, 7 MoE with 8 experts, top-2), hidden
// 512, 8 heads of 64 over 4 KV groups, dense ffn 2048, expert ffn 1024, sequence 1024, vocab 32000.
GptConfig Moe100m() {
  GptConfig c;
  c.num_layers = 8;
  c.first_dense_layers = 1;
  c.hidden_size = 512;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.ffn_hidden_size = 2048;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 1024;
  c.seq_length = 1024;
  c.vocab_size = 32000;
  return c;
}

// The published models (their Hugging Face config.json): every layer MoE, heads of 128, sequence
// 4096 for training. Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads of 128 over 4 KV
// groups, per-head query/key RMSNorm, 128 experts top-8 (renormalised) of width 768, vocabulary
// 151936, rope_theta 1e6, rms_norm_eps 1e-6, router_aux_loss_coef 1e-3.
GptConfig Qwen3Moe30bA3b(int64_t layers) {
  GptConfig c;
  c.num_layers = layers;
  c.first_dense_layers = 0;
  c.hidden_size = 2048;
  c.num_attention_heads = 32;
  c.num_query_groups = 4;
  c.kv_channels = 128;
  c.qk_layernorm = true;
  c.num_experts = 128;
  c.moe_router_topk = 8;
  c.moe_ffn_hidden_size = 768;
  c.moe_aux_loss_coeff = 1e-3f;
  c.vocab_size = 151936;
  c.rotary_base = 1e6f;
  c.norm_epsilon = 1e-6f;
  c.seq_length = 4096;
  return c;
}

// mistralai/Mixtral-8x7B-v0.1: 32 layers, hidden 4096, 32 heads over 8 KV groups, 8 experts
// top-2 (renormalised) of width 14336, vocabulary 32000, rope_theta 1e6, rms_norm_eps 1e-5,
// router_aux_loss_coef 0.02.
GptConfig Mixtral8x7b() {
  GptConfig c;
  c.num_layers = 32;
  c.first_dense_layers = 0;
  c.hidden_size = 4096;
  c.num_attention_heads = 32;
  c.num_query_groups = 8;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 14336;
  c.moe_aux_loss_coeff = 2e-2f;
  c.vocab_size = 32000;
  c.rotary_base = 1e6f;
  c.seq_length = 4096;
  return c;
}

// allenai/OLMoE-1B-7B-0924: 16 layers, hidden 2048, 16 heads (16 KV), query/key RMSNorm over the
// whole projections, 64 experts top-8 of width 1024 with gates not renormalised
// (norm_topk_prob false), vocabulary 50304, rope_theta 1e4, rms_norm_eps 1e-5,
// router_aux_loss_coef 0.01.
GptConfig Olmoe1b7b() {
  GptConfig c;
  c.num_layers = 16;
  c.first_dense_layers = 0;
  c.hidden_size = 2048;
  c.num_attention_heads = 16;
  c.num_query_groups = 16;
  c.qk_layernorm = true;
  c.qk_layernorm_across_heads = true;
  c.num_experts = 64;
  c.moe_router_topk = 8;
  c.moe_ffn_hidden_size = 1024;
  c.moe_router_pre_softmax = true;
  c.vocab_size = 50304;
  c.seq_length = 4096;
  return c;
}

// One MoE layer (no dense layer) with `experts` experts of width `ffn`, top-`topk`, at `hidden`.
GptConfig MoeLayer(int64_t hidden, int64_t experts, int64_t topk, int64_t ffn) {
  GptConfig c;
  c.num_layers = 1;
  c.first_dense_layers = 0;
  c.hidden_size = hidden;
  c.num_experts = experts;
  c.moe_router_topk = topk;
  c.moe_ffn_hidden_size = ffn;
  return c;
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> kPresets = {
      {"tiny", GptConfig{}},
      {"moe_100m", Moe100m()},
      {"qwen3_moe_8layer", Qwen3Moe8Layer()},
      {"qwen3_30b_a3b", Qwen3Moe30bA3b(48)},
      // Its first 8 layers: what fits one H200 for the benchmarks.
      {"qwen3_30b_a3b_8layer", Qwen3Moe30bA3b(8)},
      {"mixtral_8x7b", Mixtral8x7b()},
      {"olmoe_1b_7b", Olmoe1b7b()},
      // Mixtral-8x7B's expert shape.
      {"mixtral_moe_layer", MoeLayer(4096, 8, 2, 14336)},
      // DeepSeek-V3's routed experts (its shared expert aside).
      {"deepseek_v3_moe_layer", MoeLayer(7168, 256, 8, 2048)},
      {"tiny_moe_layer", MoeLayer(64, 8, 2, 32)},
  };
  return kPresets;
}

const GptConfig& ModelPresetNamed(std::string_view name) {
  const std::vector<ModelPreset>& presets = ModelPresets();
  const auto preset = std::find_if(presets.begin(), presets.end(),
                                   [&](const ModelPreset& p) { return name == p.name; });
  CHECK(preset != presets.end()) << "no model preset named " << name;
  return preset->model;
}

}  // namespace moe
