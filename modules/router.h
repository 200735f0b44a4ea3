// MoE router: logits = x router^T in f32 (tokens, experts); probs = softmax(logits); the top-k
// probabilities per token, renormalised to sum to 1 (or as they are, with
// GptConfig::moe_router_pre_softmax), weight the chosen experts.
// Auxiliary losses, each times its coefficient: the load-balancing loss (Switch / Megatron
// aux_loss over the token counts per expert) and, when its coefficient is non-zero, the z-loss.
// Saves (no offload group): x, logits (z-loss only), probs, top-k values and indices, the
// per-expert offsets. Backward takes d(weights) (tokens, k) f32 and the aux losses' upstream
// scale; it adds the input gradient to dx (+=: the MoE layer's dx, which the experts' path has
// written) and accumulates the router weight grad (+=).
#pragma once

#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"

namespace moe {

struct Routing {
  Tensor weights;   // (tokens, k) f32, rows sum to 1 unless moe_router_pre_softmax
  Tensor experts;   // (tokens, k) i32
  Tensor order;     // (tokens * k) i32: choices t*k+j sorted stably by expert
  Tensor offsets;   // (experts + 1) i32: each expert's first row in the sorted order
  Tensor aux_loss;  // (1) f32: coefficient-weighted load-balancing (+ z) loss
};

class Router {
 public:
  Router(ParameterSet& parameters, const std::string& name, const GptConfig& config);
  Routing Forward(SavedTensors& saved, const Tensor& x);
  // dweights (tokens, k) f32; aux_grad scales the aux losses' gradient (1 / micro-batches);
  // dx (tokens, hidden) in x's dtype, added to.
  void Backward(SavedTensors& saved, const Tensor& dweights, float aux_grad, const Tensor& dx);

 private:
  std::string name_;
  const GptConfig& config_;
  Parameter& weight_;
};

}  // namespace moe
