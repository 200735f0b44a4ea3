#include "modules/moe_layer.h"

#include <glog/logging.h>

#include "engine/kernels/ops.h"

namespace moe {

MoeLayer::MoeLayer(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                   int layer)
    : name_(name),
      config_(config),
      layer_(layer),
      router_(parameters, name + ".router", config),
      experts_(MakeGroupedMlp(parameters, name + ".experts", config, layer)) {}

Tensor MoeLayer::Forward(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss) {
  if (!config_.recompute_in(layer_).moe || !saved.training()) {
    return ForwardSaving(saved, x, aux_loss);
  }
  SavedTensors nothing_saved(/*training=*/false);
  const Tensor y = ForwardSaving(nothing_saved, x, aux_loss);
  saved.Save(name_ + ".input", x);
  return y;
}

Tensor MoeLayer::Backward(SavedTensors& saved, const Tensor& dy, float aux_grad,
                          bool last_of_step) {
  if (!config_.recompute_in(layer_).moe) return BackwardSaved(saved, dy, aux_grad, last_of_step);
  const Tensor x = saved.Load(name_ + ".input");
  SavedTensors replay(/*training=*/true);
  Tensor aux_loss = Tensor::Empty({1}, DType::kF32, x.device());
  ops::Fill(aux_loss, 0.0f);
  ForwardSaving(replay, x, aux_loss);
  const Tensor dx = BackwardSaved(replay, dy, aux_grad, last_of_step);
  CHECK(replay.empty()) << name_ << " recompute left saved tensors behind";
  return dx;
}

Tensor MoeLayer::ForwardSaving(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss) {
  const int64_t tokens = x.dim(0), k = config_.moe_router_topk, rows = tokens * k;
  const Device device = x.device();
  const Routing routing = router_.Forward(saved, x);
  ops::Add(aux_loss, routing.aux_loss, aux_loss);

  Tensor source_rows = Tensor::Empty({rows}, DType::kI32, device);
  Tensor inverse = Tensor::Empty({rows}, DType::kI32, device);
  ops::InvertPermutation(routing.order, k, source_rows, inverse);
  Tensor permuted = Tensor::Empty({rows, x.dim(1)}, x.dtype(), device);
  ops::GatherRows(x, source_rows, permuted);
  Tensor weights = Tensor::Empty({rows, 1}, DType::kF32, device);
  ops::GatherRows(routing.weights.View({rows, 1}), routing.order, weights);
  saved.Save(name_ + ".source_rows", source_rows);
  saved.Save(name_ + ".inverse", inverse);

  const Tensor expert_out =
      experts_->Forward(saved, permuted, routing.offsets, weights.View({rows}));
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), device);
  ops::GatherSumRows(expert_out, inverse.View({tokens, k}), y);
  return y;
}

Tensor MoeLayer::BackwardSaved(SavedTensors& saved, const Tensor& dy, float aux_grad,
                               bool last_of_step) {
  const int64_t tokens = dy.dim(0), k = config_.moe_router_topk, rows = tokens * k;
  const Device device = dy.device();
  const Tensor source_rows = saved.Load(name_ + ".source_rows");
  const Tensor inverse = saved.Load(name_ + ".inverse");

  Tensor dexpert_out = Tensor::Empty({rows, dy.dim(1)}, dy.dtype(), device);
  ops::GatherRows(dy, source_rows, dexpert_out);
  const GroupedMlp::Grads grads = experts_->Backward(saved, dexpert_out, last_of_step);

  Tensor dx = Tensor::Empty(dy.shape(), dy.dtype(), device);
  ops::GatherSumRows(grads.dx, inverse.View({tokens, k}), dx);
  Tensor dweights = Tensor::Empty({rows, 1}, DType::kF32, device);
  ops::GatherRows(grads.dweights.View({rows, 1}), inverse, dweights);
  router_.Backward(saved, dweights.View({tokens, k}), aux_grad, dx);
  return dx;
}

}  // namespace moe
