// Mixture-of-Experts MLP: route, permute, run the experts, unpermute and sum over the top-k.
//   x (tokens, hidden) -> y (tokens, hidden); dropless (every choice is computed).
// Permutation: the (tokens, k) choices sorted stably by expert; row i of the permuted batch is
// token source_rows[i] = order[i] / k, and choice (t, j) lands at row inverse[t * k + j].
// Saves (no group): source_rows and inverse; the router and the grouped MLP save their own.
// With config.recompute_in(layer).moe the layer saves only its input x: forward runs without
// saving, and backward first runs forward again from x (into a context of its own, aux loss
// discarded), then backward through it: the same kernels on the same input, so the same bits.
// Backward: dx =; returns nothing else (router and expert weight grads +=; with last_of_step
// false the experts' may wait for a later backward: grouped_mlp.h).
#pragma once

#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"
#include "modules/grouped_mlp.h"
#include "modules/router.h"

namespace moe {

class MoeLayer {
 public:
  MoeLayer(ParameterSet& parameters, const std::string& name, const GptConfig& config, int layer);
  // Returns y; adds the coefficient-weighted aux loss to `aux_loss` (1) f32.
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss);
  Tensor Backward(SavedTensors& saved, const Tensor& dy, float aux_grad, bool last_of_step = true);

 private:
  Tensor ForwardSaving(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss);
  Tensor BackwardSaved(SavedTensors& saved, const Tensor& dy, float aux_grad, bool last_of_step);

  std::string name_;
  const GptConfig& config_;
  const int layer_;  // config_.recompute_in(layer_).moe, read at run time
  Router router_;
  std::unique_ptr<GroupedMlp> experts_;
};

}  // namespace moe
