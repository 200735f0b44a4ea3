// Dense SwiGLU MLP: x (tokens, hidden) -> fc1 (2 * ffn, hidden) -> SwiGLU -> fc2 (hidden, ffn).
// fc1's output rows are [gate | up]; fc2 is initialised with std / sqrt(2 * num_layers).
// Saves (no offload group): x, fc1's output h. fc2's input is recomputed from h in backward.
// Backward: dx =; weight grads +=.
#pragma once

#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"

namespace moe {

class DenseMlp {
 public:
  DenseMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config);
  Tensor Forward(SavedTensors& saved, const Tensor& x);
  Tensor Backward(SavedTensors& saved, const Tensor& dy);

 private:
  std::string name_;
  Parameter& fc1_;
  Parameter& fc2_;
};

}  // namespace moe
