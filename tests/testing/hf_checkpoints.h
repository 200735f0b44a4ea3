// Tiny Hugging Face checkpoint directories for the hf_convert tests, written the way
// save_pretrained lays them out, with every name and shape spelled out here rather than taken
// from modules/hf_tensor_map.h, so that the tests hold the map against an independent list:
// config.json, and model.safetensors or N shards with model.safetensors.index.json.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/tensor.h"
#include "engine/io/named_tensor.h"

namespace moe::testing {

// Mixtral (per expert: block_sparse_moe.experts.{e}.w1/w3/w2; stacked: mlp.experts.gate_up_proj
// and down_proj) or Qwen3-MoE (per expert: mlp.experts.{e}.gate_proj/up_proj/down_proj; the first
// `dense_layers` layers a dense mlp.gate_proj/up_proj/down_proj), 2 layers, hidden 32, 4 heads of
// 8 (Qwen3: head_dim 16) over 2 key/value heads, 4 experts top-2 of width 24 (dense 40),
// vocabulary 50, max_position_embeddings 64.
struct HfModelFiles {
  nlohmann::json config;
  std::vector<NamedTensor> tensors;  // f32, random, in model order
};
HfModelFiles TinyMixtral(bool stacked, uint32_t seed);
HfModelFiles TinyQwen3Moe(int dense_layers, uint32_t seed);

// Writes `files` into `dir` (created): config.json and, with shards == 1, model.safetensors,
// else model-0000i-of-0000N.safetensors and the index; tensors stored as `dtype`.
void WriteHfDirectory(const std::string& dir, const HfModelFiles& files, int shards = 1,
                      DType dtype = DType::kF32);

// Every tensor of the safetensors files of `dir` (any layout), f32 or bf16 values widened.
std::map<std::string, std::vector<float>> ReadAllTensors(const std::string& dir);

}  // namespace moe::testing
