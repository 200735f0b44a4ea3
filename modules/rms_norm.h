// RMSNorm module. x, y (tokens, hidden); weight (hidden), initialised to 1, no weight decay.
// Forward with a `residual` first adds it to x in place (x = x + residual, in the norm's kernel:
// a residual stream's add) and normalises that sum. Saves under `name`: x and rstd (tokens) f32.
// Backward: dx = (plus `residual`, the gradient of a residual stream around the norm, where given:
// one kernel, no separate add), weight.grad += (MaterializedGrad). Recompute(saved) gives forward's
// y again from the saved x (before Backward; bit-identical).
#pragma once

#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"

namespace moe {

class RmsNorm {
 public:
  RmsNorm(ParameterSet& parameters, const std::string& name, int64_t hidden, float eps);
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& residual = Tensor());
  Tensor Backward(SavedTensors& saved, const Tensor& dy, const Tensor& residual = Tensor());
  Tensor Recompute(const SavedTensors& saved) const;

 private:
  std::string name_;
  Parameter& weight_;
  float eps_;
};

}  // namespace moe
