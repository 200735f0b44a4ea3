// The model shapes the trainer-level tests share. TinyModel: 2 layers (one dense, one MoE with 4
// experts, top-2), hidden 32, 4 heads over 2 KV groups, sequence 16, vocabulary 64; unfused
// grouped MLP. Fast on the CPU, big enough for every code path. Tests adjust fields as needed.
#pragma once

#include "modules/gpt_config.h"
#include "modules/model_presets.h"

namespace moe::testing {

inline GptConfig TinyModel() {
  GptConfig c;
  c.num_layers = 2;
  c.first_dense_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 64;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  c.moe_grouped_mlp = GroupedMlpKind::kUnfused;
  c.seq_length = 16;
  c.vocab_size = 64;
  return c;
}

// moe_train's default model (its flags' defaults, configs/tiny.flags: the "tiny" preset of
// modules/model_presets.h): 2 layers (one dense, one MoE with 4 experts, top-2, expert ffn 128),
// hidden 128, 2 heads over 1 KV group (head dim 64, as the CUDA attention takes), sequence 64,
// vocabulary 256; fused grouped MLP.
inline GptConfig DefaultRunModel() { return ModelPresetNamed("tiny"); }

}  // namespace moe::testing
