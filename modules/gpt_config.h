// The model's shape: a decoder-only transformer whose first `first_dense_layers` layers have a
// dense SwiGLU MLP and the rest a Mixture-of-Experts MLP. Field names match the moe_train flags.
// Derived sizes are computed here and nowhere else.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/status.h"

namespace moe {

enum class GroupedMlpKind { kFused, kUnfused };
// The expert GEMMs' precision (--fp8_recipe): bf16 (f32 on the CPU), or DeepSeek-V3's blockwise
// FP8 (fused grouped MLP only; modules/fp8_expert_gemms.h).
enum class Fp8Recipe { kNone, kBlockwise };

// Selective recompute (--recompute_modules, modules/offload_groups.h has the names and rules):
// what a module drops in forward and recomputes in backward from what it keeps.
struct RecomputeModules {
  bool layernorm = false;  // the attn_norm and mlp_norm outputs, from the norms' inputs
  bool moe_act = false;    // the SwiGLU output (fc2's input), from the fc1 output
  bool moe = false;        // the whole MoE layer (router, permutation, grouped MLP), from its input
  bool core_attn = false;  // core attention's output and softmax statistics, from q, k, v

  bool any() const { return layernorm || moe_act || moe || core_attn; }
  bool operator==(const RecomputeModules&) const = default;
};

// The defaults are moe_train's flag defaults (tests/apps/moe_train_flags_test.cc checks it): the
// "tiny" model preset (model_presets.h).
struct GptConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 128;
  int64_t num_attention_heads = 2;
  int64_t num_query_groups = 1;  // KV heads
  // The attention head dimension (Megatron's --kv_channels); 0: hidden_size / num_attention_heads.
  // Qwen3-30B-A3B's is 128 on a hidden size of 2048 over 32 heads.
  int64_t kv_channels = 0;
  // An RMSNorm of the queries and the keys before RoPE (Megatron's --qk_layernorm): Qwen3's, one
  // weight of head_dim shared by every head and applied to each; with qk_layernorm_across_heads,
  // OLMoE's, one over each token's whole query projection (heads * head_dim) and one over its
  // keys (num_query_groups * head_dim).
  bool qk_layernorm = false;
  bool qk_layernorm_across_heads = false;
  int64_t ffn_hidden_size = 256;  // dense layers
  int64_t num_experts = 4;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 128;  // per expert
  float moe_aux_loss_coeff = 1e-2f;
  float moe_z_loss_coeff = 0.0f;  // 0 disables the z-loss
  // Megatron's --moe_router_pre_softmax: the gate weights of a token's top-k experts are their
  // probabilities under the softmax over all experts (OLMoE, norm_topk_prob false). Off: those
  // probabilities renormalised to sum 1 over the top k, the softmax of the top-k logits (Qwen3-MoE
  // and Mixtral, norm_topk_prob true).
  bool moe_router_pre_softmax = false;
  GroupedMlpKind moe_grouped_mlp = GroupedMlpKind::kFused;  // as --moe_grouped_mlp
  Fp8Recipe fp8_recipe = Fp8Recipe::kNone;  // as --fp8_recipe; how the model runs, not its shape
  RecomputeModules recompute;               // how the model runs, not its shape
  int64_t recompute_num_layers = -1;        // recompute only in layers [0, this); -1: every layer
  // Non-empty (one entry per layer): what each layer recomputes, the memory planner's choice
  // (modules/memory_planner.h); recompute and recompute_num_layers are then unused.
  std::vector<RecomputeModules> recompute_by_layer;
  // Token rows per chunk of the LM head and loss (modules/lm_head_loss.h); 0: as many as fit in
  // kLogitsChunkBytes. How the model runs, not its shape (tests set it).
  int64_t head_chunk_rows = 0;
  // The fused grouped MLP adds its expert weight gradients once per this many of a step's
  // micro-batches (--moe_wgrad_micro_batches), each pass over the gradients summing all their rows
  // (modules/fused_grouped_mlp.h); 1: every micro-batch. How the model runs, not its shape.
  int64_t moe_wgrad_micro_batches = 1;
  int64_t first_dense_layers = 1;
  int64_t seq_length = 64;
  int64_t vocab_size = 256;
  float rotary_base = 10000.0f;  // RoPE's base (Hugging Face's rope_theta)
  float norm_epsilon = 1e-5f;    // every RMSNorm's epsilon
  float init_std = 0.02f;

  int64_t head_dim() const {
    return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
  }
  int64_t q_dim() const { return num_attention_heads * head_dim(); }  // the query projection's
  int64_t kv_dim() const { return num_query_groups * head_dim(); }
  bool is_moe_layer(int64_t layer) const { return layer >= first_dense_layers; }
  // What `layer` recomputes: its recompute_by_layer entry, else `recompute` in the first
  // recompute_num_layers layers, else nothing.
  RecomputeModules recompute_in(int64_t layer) const {
    if (!recompute_by_layer.empty()) return recompute_by_layer[static_cast<size_t>(layer)];
    return recompute_num_layers < 0 || layer < recompute_num_layers ? recompute
                                                                    : RecomputeModules{};
  }
  int64_t num_moe_layers() const { return num_layers - std::min(num_layers, first_dense_layers); }

  // Parameter counts: all of them, and those one token's forward touches (top-k experts only).
  int64_t qk_norm_parameters() const;  // the query and key norms' weights, 0 without them
  int64_t attention_parameters() const;
  int64_t dense_mlp_parameters() const { return 3 * hidden_size * ffn_hidden_size; }
  int64_t expert_parameters() const { return 3 * hidden_size * moe_ffn_hidden_size; }
  int64_t total_parameters() const;
  int64_t active_parameters() const;
  // Training FLOPs per token: 6 x active matmul parameters + causal attention (fwd + bwd).
  double train_flops_per_token() const;

  bool operator==(const GptConfig&) const = default;
};

// The relations between the fields (each field's own range is its flag's, in moe_train's flag
// table): hidden_size a multiple of num_attention_heads unless kv_channels sets the head dim,
// num_attention_heads a multiple of num_query_groups, an even head dim,
// qk_layernorm_across_heads only with qk_layernorm, moe_router_topk <= num_experts,
// first_dense_layers <= num_layers, the FP8 recipe only with the fused grouped MLP and hidden_size
// and moe_ffn_hidden_size multiples of kFp8RowAlignment. The error names the fields as flags
// (--hidden_size=66 is not a multiple of --num_attention_heads=4).
Status CheckModel(const GptConfig& m);

}  // namespace moe
