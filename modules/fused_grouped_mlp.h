// The fused grouped MLP (contract in grouped_mlp.h): one grouped GEMM launch over all experts for
// fc1, SwiGLU x routing probability over all rows, one grouped GEMM for fc2; backward likewise
// (grouped GEMMs for the input gradients, grouped weight-gradient GEMMs). The expert row ranges
// are read back to the host once, in forward, and kept for backward.
// Saves: in group fused_group_mlp (opened at the input, committed after fc2) fc1's input x, the
// activation input h = fc1(x) and fc2's input a = swiglu(h) * weights. Outside any group (small,
// never offloaded): the routing weights (rows) f32, which SwiGLU's backward needs, and the host
// copy of the offsets (a CPU tensor).
// Backward: dx (=) and dweights (rows) f32 (=); expert weight grads +=.
#pragma once

#include "modules/grouped_mlp.h"

namespace moe {

class FusedGroupedMlp final : public GroupedMlp {
 public:
  using GroupedMlp::GroupedMlp;
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets,
                 const Tensor& weights) override;
  Grads Backward(SavedTensors& saved, const Tensor& dy) override;
};

}  // namespace moe
