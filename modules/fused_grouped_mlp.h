// The fused grouped MLP (contract in grouped_mlp.h): one grouped GEMM launch over all experts for
// fc1 with SwiGLU x routing probability (ops::GroupedMatmulSwiglu: in its epilogue on Hopper),
// one grouped GEMM for fc2; backward likewise: fc2's input gradient with the SwiGLU backward
// (ops::GroupedMatmulSwigluBackward: in its epilogue on Hopper, fc2's input gradient never
// stored), fc1's input gradient, grouped weight-gradient GEMMs. The grouped GEMMs take
// the expert row ranges on the device; only where they also need them on the host
// (ops::GroupedMatmulNeedsHostOffsets) are they read back, once, in forward (unless the caller
// has them) and kept for backward. Otherwise neither forward nor backward waits for the device.
// Saves: in group fused_group_mlp (opened at the input, committed after fc2) fc1's input x, the
// activation input h = fc1(x) and fc2's input a = swiglu(h) * weights (but not a with
// config.recompute_in(layer).moe_act: backward recomputes it from h, as the unfused path always
// does). Outside any group (small, never offloaded): the routing weights (rows) f32, which SwiGLU's
// backward needs, the offsets and, where needed, their host copy (a CPU tensor). Backward: dx (=)
// and dweights (rows) f32 (=); expert weight grads +=.
// Weight gradients once per config.moe_wgrad_micro_batches micro-batches: a backward keeps its
// weight-gradient operands (fc2's dy and a, fc1's dh and x, the offsets: rows x (2 hidden + 3 ffn)
// elements) until that many are held or the step's last backward of the layer comes, which adds
// them all, each weight's gradient in one ops::GroupedMatmulWeightGrad over all their rows: on
// Hopper one pass over the gradient in memory instead of one per micro-batch (the pass is bound by
// that traffic where experts get few rows: the preset's bf16 gradients of a layer, 1.2 GB, are
// read and written per pass). With source slots (grouped_mlp.h) one pass per source instead.
#pragma once

#include <vector>

#include "engine/kernels/ops.h"
#include "modules/grouped_mlp.h"

namespace moe {

class FusedGroupedMlp final : public GroupedMlp {
 public:
  using GroupedMlp::GroupedMlp;
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets, const Tensor& weights,
                 int segment = 0, const Tensor& known_host_offsets = Tensor()) override;
  Grads BackwardSegment(SavedTensors& saved, const Tensor& dy, int segment) override;
  void EndBackward(bool last_of_step) override;

 private:
  // The operands of one micro-batch's weight gradients, not yet added.
  struct PendingWeightGrads {
    ops::GroupedRows fc2;  // dy, a
    ops::GroupedRows fc1;  // dh, x
    Tensor host_offsets;   // what both parts' host_offsets view, or undefined
    int segment = 0;
  };

  // Whether this layer's grouped GEMMs need host offsets (the same in forward and backward).
  bool NeedsHostOffsets() const;
  // Adds the pending micro-batches' weight gradients and forgets them.
  void AddWeightGrads();

  std::vector<PendingWeightGrads> pending_;
  int64_t pending_micro_batches_ = 0;
};

}  // namespace moe
