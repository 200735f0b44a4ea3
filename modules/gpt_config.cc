#include "modules/gpt_config.h"

#include <string>
#include <utility>

#include "engine/kernels/fp8_scaling.h"

namespace moe {

Status CheckModel(const GptConfig& m) {
  if (m.kv_channels == 0 && m.hidden_size % m.num_attention_heads != 0) {
    return InvalidArgument(
        "--hidden_size=" + std::to_string(m.hidden_size) +
        " is not a multiple of --num_attention_heads=" + std::to_string(m.num_attention_heads) +
        " (or set the head dimension with --kv_channels)");
  }
  if (m.num_attention_heads % m.num_query_groups != 0) {
    return InvalidArgument(
        "--num_attention_heads=" + std::to_string(m.num_attention_heads) +
        " is not a multiple of --num_query_groups=" + std::to_string(m.num_query_groups));
  }
  if (m.head_dim() % 2 != 0) {
    return InvalidArgument(
        (m.kv_channels > 0 ? std::string("--kv_channels")
                           : std::string("--hidden_size / --num_attention_heads")) +
        " = " + std::to_string(m.head_dim()) + " must be even for rotary embeddings");
  }
  if (m.qk_layernorm_across_heads && !m.qk_layernorm) {
    return InvalidArgument("--qk_layernorm_across_heads needs --qk_layernorm");
  }
  if (m.moe_router_topk > m.num_experts) {
    return InvalidArgument("--moe_router_topk=" + std::to_string(m.moe_router_topk) +
                           " exceeds --num_experts=" + std::to_string(m.num_experts));
  }
  if (m.fp8_recipe != Fp8Recipe::kNone) {
    if (m.moe_grouped_mlp != GroupedMlpKind::kFused) {
      return InvalidArgument("--fp8_recipe=blockwise needs --moe_grouped_mlp=fused");
    }
    for (const auto& [flag, value] : {std::pair{"--hidden_size", m.hidden_size},
                                      std::pair{"--moe_ffn_hidden_size", m.moe_ffn_hidden_size}}) {
      if (value % kFp8RowAlignment != 0) {
        return InvalidArgument(std::string(flag) + "=" + std::to_string(value) +
                               " must be a multiple of " + std::to_string(kFp8RowAlignment) +
                               " for --fp8_recipe=blockwise");
      }
    }
  }
  if (m.first_dense_layers > m.num_layers) {
    return InvalidArgument("--first_dense_layers=" + std::to_string(m.first_dense_layers) +
                           " must be in [0, --num_layers=" + std::to_string(m.num_layers) + "]");
  }
  return Status::Ok();
}

int64_t GptConfig::qk_norm_parameters() const {
  if (!qk_layernorm) return 0;
  return qk_layernorm_across_heads ? q_dim() + kv_dim() : 2 * head_dim();
}

int64_t GptConfig::attention_parameters() const {
  // q and o projections (hidden x q_dim), k and v (hidden x kv_dim), the two layer norms and the
  // query and key norms.
  return 2 * hidden_size * q_dim() + 2 * hidden_size * kv_dim() + 2 * hidden_size +
         qk_norm_parameters();
}

int64_t GptConfig::total_parameters() const {
  const int64_t dense = std::min(num_layers, first_dense_layers);
  const int64_t moe = num_moe_layers();
  const int64_t router = hidden_size * num_experts;
  return 2 * vocab_size * hidden_size + hidden_size +  // embedding, head, final norm
         num_layers * attention_parameters() + dense * dense_mlp_parameters() +
         moe * (router + num_experts * expert_parameters());
}

int64_t GptConfig::active_parameters() const {
  const int64_t dense = std::min(num_layers, first_dense_layers);
  const int64_t moe = num_moe_layers();
  const int64_t router = hidden_size * num_experts;
  return 2 * vocab_size * hidden_size + hidden_size + num_layers * attention_parameters() +
         dense * dense_mlp_parameters() + moe * (router + moe_router_topk * expert_parameters());
}

double GptConfig::train_flops_per_token() const {
  // The embedding lookup does no matmul; the head does. Causal attention: QK^T and PV over on
  // average seq/2 keys, 2 FLOPs each per head dim, times 3 for forward + backward.
  const double matmul_parameters =
      static_cast<double>(active_parameters() - vocab_size * hidden_size);
  const double attention = 3.0 * 2.0 * 2.0 * num_layers * q_dim() * (seq_length / 2.0);
  return 6.0 * matmul_parameters + attention;
}

}  // namespace moe
