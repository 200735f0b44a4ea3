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
// With config.fp8_recipe blockwise (fp8_expert_gemms.h) all six GEMMs run in FP8: x and a
// quantised in 1 x 128 tiles (fc1 and fc2 forward), dy and dh likewise (their input gradients;
// x and dy read where the MoE layer's permutation finds them, never gathered in bf16), the
// weights once per step; the weight gradients take x, a, dy and dh in column tiles (each expert's
// rows transposed, one scale per column and 128-row window), which the pass that writes an
// operand's row tiles writes too.
// SwiGLU's forward writes a's FP8 forms itself and its backward dh's (ops::SwigluForwardQuantized,
// SwigluBackwardQuantized: neither a nor dh is in memory in bf16). x and a are saved only as their
// column tiles, e4m3 with f32 scales (about 1 + 4/128 bytes an element instead of 2: the
// fused_group_mlp group moves about half the bytes); the weight gradients' operands wait in FP8.
#pragma once

#include <vector>

#include "engine/kernels/ops.h"
#include "modules/fp8_expert_gemms.h"
#include "modules/grouped_mlp.h"

namespace moe {

class FusedGroupedMlp final : public GroupedMlp {
 public:
  using GroupedMlp::GroupedMlp;
  Tensor Forward(SavedTensors& saved, const PermutedRows& x_rows, const Tensor& offsets,
                 const Tensor& weights, int segment = 0,
                 const Tensor& known_host_offsets = Tensor()) override;
  Grads BackwardSegment(SavedTensors& saved, const PermutedRows& dy_rows, int segment) override;
  void EndBackward(bool last_of_step) override;

 private:
  // The operands of one micro-batch's weight gradients, not yet added.
  struct PendingWeightGrads {
    ops::GroupedRows fc2;  // dy, a
    ops::GroupedRows fc1;  // dh, x
    Tensor host_offsets;   // what both parts' host_offsets view, or undefined
    int segment = 0;
    Fp8WeightGradPart fc2_fp8, fc1_fp8;  // with fp8() instead of fc2 and fc1
  };

  // What both backwards load of a segment's saves: the offsets (and their host copy where the
  // GEMMs need it), the routing weights, fc1's output h.
  struct SavedSegment {
    Tensor offsets, host_offsets, weights, h;
  };

  // Whether this layer's grouped GEMMs need host offsets (the same in forward and backward).
  bool NeedsHostOffsets() const;
  SavedSegment LoadSegment(SavedTensors& saved, int segment) const;
  // fc2's input a = swiglu(h) * weights again (with config.recompute_in(layer).moe_act).
  Tensor RecomputedA(const SavedSegment& s) const;
  bool fp8() const;  // --fp8_recipe=blockwise
  // FP8 column tiles saved as `what` (".x", ".a") and `what`_scales.
  void SaveColumns(SavedTensors& saved, const char* what, int segment,
                   const Fp8Columns& columns) const;
  Fp8Columns LoadColumns(SavedTensors& saved, const char* what, int segment, int64_t rows) const;
  Grads Fp8BackwardSegment(SavedTensors& saved, const PermutedRows& dy, int segment);
  // Adds the pending micro-batches' weight gradients and forgets them.
  void AddWeightGrads();

  std::vector<PendingWeightGrads> pending_;
  Fp8ExpertWeights fc1_fp8_, fc2_fp8_;  // with fp8(): the quantised weights of this step
  int64_t pending_micro_batches_ = 0;
};

}  // namespace moe
