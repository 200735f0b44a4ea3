// Causal self-attention with RoPE and grouped KV heads.
//   x (tokens = batch * seq, hidden) -> y (tokens, hidden).
//   Weights (PyTorch layout): q_proj (q_dim, hidden), k_proj and v_proj (kv_dim, hidden),
//   o_proj (hidden, q_dim), q_dim = heads * head_dim (GptConfig); o_proj initialised with std / sqrt(2 * num_layers). q_proj, k_proj
//   and v_proj are one parameter stack: one GEMM each way computes all three projections, and
//   ops::RopeQkvForward / RopeQkvBackward move the heads between the packed product and q, k, v.
// Saved tensors, each in its offload group for `layer`:
//   qkv_linear: x;   core_attn: q, k (after RoPE), v, lse;   attn_proj: out (the input of o_proj,
//   which core attention's backward also reads).
// With config.recompute_in(layer).core_attn, lse and out are not saved: backward runs the attention
// forward again from q, k, v first (the same kernel, so the same bits).
// RoPE reads the model's RotaryTable (below), which every layer's attention shares.
// Backward: dx =; every weight grad +=.
#pragma once

#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"

namespace moe {

// RoPE's (seq_length, head_dim/2, 2) f32 table of {cos, sin} (ops::RopeTable): a function of the
// config alone, so one per model (chunk), made on the first call on the device that asks and kept
// (16 KiB for seq 64 and head_dim 64, 2 MiB for 4096 and 128).
class RotaryTable {
 public:
  explicit RotaryTable(const GptConfig& config) : config_(config) {}
  const Tensor& On(Device device);

 private:
  const GptConfig& config_;
  Tensor table_;
};

class SelfAttention {
 public:
  SelfAttention(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                int layer, RotaryTable& rotary_table);
  Tensor Forward(SavedTensors& saved, const Tensor& x);
  Tensor Backward(SavedTensors& saved, const Tensor& dy);

 private:
  std::string name_;
  const GptConfig& config_;
  int layer_;
  ParameterStack& qkv_proj_;  // q_proj, k_proj, v_proj rows
  Parameter& o_proj_;
  RotaryTable& rotary_table_;
};

}  // namespace moe
