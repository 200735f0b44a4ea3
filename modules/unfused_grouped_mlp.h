// The unfused grouped MLP (contract in grouped_mlp.h): per-expert GEMMs for fc1, one activation
// kernel over all rows, per-expert GEMMs for fc2 (the expert row counts are read back to the
// host once, in forward, and saved for backward).
// Saves: fc1's input x in group expert_fc1 (committed after fc1); the activation inputs h and
// weights in group moe_act (committed after fc2); the host offsets outside any group. fc2's
// input is recomputed from h in backward.
// Backward: dx (=) and dweights (rows) f32 (=); expert weight grads +=.
#pragma once

#include "modules/grouped_mlp.h"

namespace moe {

class UnfusedGroupedMlp final : public GroupedMlp {
 public:
  using GroupedMlp::GroupedMlp;
  Tensor Forward(SavedTensors& saved, const PermutedRows& x_rows, const Tensor& offsets,
                 const Tensor& weights, int segment = 0,
                 const Tensor& known_host_offsets = Tensor()) override;
  Grads BackwardSegment(SavedTensors& saved, const PermutedRows& dy_rows, int segment) override;
  void EndBackward(bool last_of_step) override;
};

}  // namespace moe
