#include "modules/router.h"

#include "engine/kernels/ops.h"
#include "modules/linear.h"

namespace moe {

Router::Router(ParameterSet& parameters, const std::string& name, const GptConfig& config)
    : name_(name),
      config_(config),
      weight_(parameters.Create({name + ".weight",
                                 {config.num_experts, config.hidden_size},
                                 Init::kNormal,
                                 config.init_std})) {}

Routing Router::Forward(SavedTensors& saved, const Tensor& x) {
  const int64_t tokens = x.dim(0), experts = config_.num_experts, k = config_.moe_router_topk;
  const Device device = x.device();
  Tensor logits = Tensor::Empty({tokens, experts}, DType::kF32, device);
  LinearForwardInto(x, weight_.value, logits);
  Tensor probs = Tensor::Empty({tokens, experts}, DType::kF32, device);
  Routing routing;
  Tensor top_values = Tensor::Empty({tokens, k}, DType::kF32, device);
  routing.weights = Tensor::Empty({tokens, k}, DType::kF32, device);
  routing.experts = Tensor::Empty({tokens, k}, DType::kI32, device);
  ops::RouterGateForward(logits, !config_.moe_router_pre_softmax, probs, top_values,
                         routing.weights, routing.experts);

  routing.order = Tensor::Empty({tokens * k}, DType::kI32, device);
  routing.offsets = Tensor::Empty({experts + 1}, DType::kI32, device);
  ops::SortByKey(routing.experts.View({tokens * k}), experts, routing.order, routing.offsets);

  routing.aux_loss = Tensor::Empty({1}, DType::kF32, device);
  ops::LoadBalancingLossForward(probs, routing.offsets, k, routing.aux_loss);
  ops::Scale(routing.aux_loss, config_.moe_aux_loss_coeff, routing.aux_loss);
  if (config_.moe_z_loss_coeff != 0.0f) {
    Tensor z_loss = Tensor::Empty({1}, DType::kF32, device);
    ops::ZLossForward(logits, z_loss);
    ops::Axpy(config_.moe_z_loss_coeff, z_loss, routing.aux_loss);
    saved.Save(name_ + ".logits", logits);
  }
  saved.Save(name_ + ".x", x);
  saved.Save(name_ + ".probs", probs);
  saved.Save(name_ + ".top_values", top_values);
  saved.Save(name_ + ".experts", routing.experts);
  saved.Save(name_ + ".offsets", routing.offsets);
  return routing;
}

void Router::Backward(SavedTensors& saved, const Tensor& dweights, float aux_grad,
                      const Tensor& dx) {
  const Tensor top_values = saved.Load(name_ + ".top_values");
  const Tensor experts = saved.Load(name_ + ".experts");
  const Tensor probs = saved.Load(name_ + ".probs");
  const Tensor offsets = saved.Load(name_ + ".offsets");
  const Device device = dweights.device();

  // The z-loss adds its gradient in f32 before the matmuls' cast; without it the gate writes
  // the compute dtype directly.
  const bool z_loss = config_.moe_z_loss_coeff != 0.0f;
  const Tensor x = saved.Load(name_ + ".x");
  Tensor dlogits = Tensor::Empty(probs.shape(), z_loss ? DType::kF32 : x.dtype(), device);
  ops::RouterGateBackward(dweights, top_values, experts, probs, offsets,
                          aux_grad * config_.moe_aux_loss_coeff, !config_.moe_router_pre_softmax,
                          dlogits);
  Tensor dlogits_compute = dlogits;
  if (z_loss) {
    ops::ZLossBackward(saved.Load(name_ + ".logits"), aux_grad * config_.moe_z_loss_coeff, dlogits);
    if (x.dtype() != DType::kF32) {  // the matmuls run in the compute dtype
      dlogits_compute = Tensor::Empty(dlogits.shape(), x.dtype(), device);
      ops::Cast(dlogits, dlogits_compute);
    }
  }
  LinearBackward(dlogits_compute, x, weight_, dx, /*accumulate_dx=*/true);
}

}  // namespace moe
