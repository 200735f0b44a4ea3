#include "modules/gpt_config.h"

namespace moe {

int64_t GptConfig::attention_parameters() const {
  // q and o projections (hidden x hidden), k and v (hidden x kv_dim), two norms.
  return 2 * hidden_size * hidden_size + 2 * hidden_size * kv_dim() + 2 * hidden_size;
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
  const double attention = 3.0 * 2.0 * 2.0 * num_layers * hidden_size * (seq_length / 2.0);
  return 6.0 * matmul_parameters + attention;
}

}  // namespace moe
