// The fused grouped MLP (contract in grouped_mlp.h): fc1 and SwiGLU x routing probability in one
// grouped GEMM launch over all experts (GroupedMatmulSwiglu), fc2 in another; backward: fc2's
// weight gradient, fc2's input gradient with SwiGLU's backward fused in
// (GroupedMatmulSwigluBackward), then fc1's input and weight gradients. Every op reads the
// expert offsets from device memory: the host never waits for them.
// Saves: in group fused_group_mlp (opened at the input, committed after fc2) fc1's input x, the
// activation input h = fc1(x) and fc2's input a = swiglu(h) * weights. Outside any group (small,
// never offloaded): the routing weights (rows) f32, which SwiGLU's backward needs, and the
// offsets (experts + 1) i32 as given.
// Backward: dx (=) and dweights (rows) f32 (=); expert weight grads +=.
#pragma once

#include <string>

#include "modules/grouped_mlp.h"

namespace moe {

class FusedGroupedMlp final : public GroupedMlp {
 public:
  FusedGroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                  int layer);
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets,
                 const Tensor& weights) override;
  Grads Backward(SavedTensors& saved, const Tensor& dy) override;

 private:
  std::string name_;
  const GptConfig& config_;
  int layer_;
  ExpertWeights weights_;
};

}  // namespace moe
