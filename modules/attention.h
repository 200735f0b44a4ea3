// Causal self-attention with RoPE and grouped KV heads.
//   x (tokens = batch * seq, hidden) -> y (tokens, hidden).
//   Weights (PyTorch layout): q_proj (q_dim, hidden), k_proj and v_proj (kv_dim, hidden),
//   o_proj (hidden, q_dim), q_dim = heads * head_dim, kv_dim = kv_heads * head_dim (GptConfig);
//   o_proj initialised with std / sqrt(2 * num_layers). q_proj, k_proj and v_proj are one
//   parameter stack: one GEMM each way computes all three projections, and
//   ops::RopeQkvForward / RopeQkvBackward move the heads between the packed product and q, k, v.
// With config.qk_layernorm (Qwen3, OLMoE), q and k are normalised before RoPE: the packed
//   product is split unrotated into q_raw (tokens, heads, head_dim), k_raw and v; q_norm
//   (weight head_dim, shared by every query head) normalises each query head, k_norm each key
//   head; with qk_layernorm_across_heads instead each token's whole q_raw (weight q_dim) and
//   k_raw (weight kv_dim); ops::RopeForward then rotates them into q and k. The norms are
//   RmsNorm modules (weights initialised to 1, no weight decay) named `name`.q_norm / .k_norm.
// Saved tensors, each in its offload group for `layer`:
//   qkv_linear: x, and with the query/key norm q_norm.{x, rstd} and k_norm.{x, rstd} (q_raw and
//   k_raw as the norms see them, rstd f32 per head or per token);   core_attn: q, k (after
//   RoPE), v, lse;   attn_proj: out (the input of o_proj, which core attention's backward also
//   reads).
// With config.recompute_in(layer).core_attn, lse and out are not saved: backward runs the attention
// forward again from q, k, v first (the same kernel, so the same bits).
// RoPE reads the model's RotaryTable (below), which every layer's attention shares.
// Backward: dx =; every weight grad +=.
#pragma once

#include <memory>
#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"
#include "modules/rms_norm.h"

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
  // Attention's heads, each (tokens, heads or kv_heads, head_dim).
  struct Heads {
    Tensor q, k, v;
  };
  Heads EmptyHeads(int64_t tokens, const Tensor& like) const;
  // heads (allocated) = the heads of qkv, q's and k's rotated. With the query/key norm, heads.q
  // and heads.k are normalised first: the given tensors receive the unnormalised heads (which
  // the norms save) and are replaced by the normalised, rotated ones.
  void SplitHeads(SavedTensors& saved, const Tensor& qkv, Heads& heads);
  // Its backward: returns the gradient of qkv; the norms' weight grads +=. Takes the heads'
  // gradients by value to release each once it has been used.
  Tensor MergeHeadGradients(SavedTensors& saved, Heads grads);
  // A (tokens, heads, head_dim) tensor as its norm's rows: one per head, or with
  // qk_layernorm_across_heads one per token.
  Tensor NormRows(const Tensor& heads) const;

  std::string name_;
  const GptConfig& config_;
  int layer_;
  ParameterStack& qkv_proj_;                  // q_proj, k_proj, v_proj rows
  std::unique_ptr<RmsNorm> q_norm_, k_norm_;  // with config.qk_layernorm only
  Parameter& o_proj_;
  RotaryTable& rotary_table_;
};

}  // namespace moe
