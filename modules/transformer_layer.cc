#include "modules/transformer_layer.h"

#include <optional>

#include "engine/kernels/ops.h"
#include "engine/runtime/step_timeline.h"
#include "modules/offload_groups.h"

namespace moe {
std::string LayerName(int layer) { return "layers." + std::to_string(layer); }

TransformerLayer::TransformerLayer(ParameterSet& parameters, const GptConfig& config, int layer,
                                   RotaryTable& rotary_table, ExpertParallel* expert_parallel)
    : config_(config),
      layer_(layer),
      attn_norm_(parameters, LayerName(layer) + ".attn_norm", config.hidden_size,
                 config.norm_epsilon),
      attention_(parameters, LayerName(layer) + ".attention", config, layer, rotary_table),
      mlp_norm_(parameters, LayerName(layer) + ".mlp_norm", config.hidden_size,
                config.norm_epsilon) {
  if (config.is_moe_layer(layer)) {
    moe_mlp_ = std::make_unique<MoeLayer>(parameters, LayerName(layer) + ".moe", config, layer,
                                          expert_parallel);
  } else {
    dense_mlp_ = std::make_unique<DenseMlp>(parameters, LayerName(layer) + ".mlp", config);
  }
}

void TransformerLayer::DropNormOutput(SavedTensors& saved, const Tensor& output,
                                      std::vector<std::string>& keys) const {
  if (!config_.recompute_in(layer_).layernorm || !saved.training()) return;
  keys = saved.Drop(output);
}

void TransformerLayer::RecomputeNormOutput(SavedTensors& saved, const RmsNorm& norm,
                                           const std::vector<std::string>& keys) const {
  if (!config_.recompute_in(layer_).layernorm) return;
  const Tensor output = norm.Recompute(saved);
  for (const std::string& key : keys) saved.Save(key, output);
}

Tensor TransformerLayer::Forward(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss) {
  std::optional<TraceSpan> span(std::in_place, x.device(), "attention forward", layer_);
  const size_t attn_norm_group = saved.OpenGroup(kAttnNormGroup, layer_);
  const Tensor normed = attn_norm_.Forward(saved, x);
  saved.CloseGroup(attn_norm_group);
  const Tensor h = attention_.Forward(saved, normed);
  DropNormOutput(saved, normed, attn_norm_output_keys_);
  span.emplace(x.device(), moe_mlp_ ? "moe forward" : "mlp forward", layer_);

  const size_t mlp_norm_group = saved.OpenGroup(kMlpNormGroup, layer_);
  const Tensor mlp_in = mlp_norm_.Forward(saved, h, /*residual=*/x);  // h += x first
  saved.CloseGroup(mlp_norm_group);
  saved.CommitGroup(attn_norm_group);  // after the residual add has read x
  Tensor y =
      moe_mlp_ ? moe_mlp_->Forward(saved, mlp_in, aux_loss) : dense_mlp_->Forward(saved, mlp_in);
  DropNormOutput(saved, mlp_in, mlp_norm_output_keys_);
  ops::Add(h, y, y);
  saved.CommitGroup(mlp_norm_group);
  return y;
}

Tensor TransformerLayer::Backward(SavedTensors& saved, const Tensor& dy, float aux_grad,
                                  bool last_of_step) {
  std::optional<TraceSpan> span(std::in_place, dy.device(),
                                moe_mlp_ ? "moe backward" : "mlp backward", layer_);
  RecomputeNormOutput(saved, mlp_norm_, mlp_norm_output_keys_);
  const Tensor dmlp_in = moe_mlp_ ? moe_mlp_->Backward(saved, dy, aux_grad, last_of_step)
                                  : dense_mlp_->Backward(saved, dy);
  const Tensor dh = mlp_norm_.Backward(saved, dmlp_in, /*residual=*/dy);
  span.emplace(dy.device(), "attention backward", layer_);
  RecomputeNormOutput(saved, attn_norm_, attn_norm_output_keys_);
  const Tensor dnormed = attention_.Backward(saved, dh);
  return attn_norm_.Backward(saved, dnormed, /*residual=*/dh);
}

}  // namespace moe
