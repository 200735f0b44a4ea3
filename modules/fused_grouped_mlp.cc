#include "modules/fused_grouped_mlp.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/kernels/ops.h"
#include "engine/runtime/step_timeline.h"
#include "modules/offload_groups.h"

namespace moe {

bool FusedGroupedMlp::NeedsHostOffsets() const {
  const Tensor& fc1 = fc1_.value;
  const Tensor& fc2 = fc2_.value;
  return ops::GroupedMatmulNeedsHostOffsets(fc1.device(), fc1.dtype(), fc1.shape()) ||
         ops::GroupedMatmulNeedsHostOffsets(fc2.device(), fc2.dtype(), fc2.shape());
}

Tensor FusedGroupedMlp::Forward(SavedTensors& saved, const PermutedRows& x_rows,
                                const Tensor& offsets, const Tensor& weights, int segment,
                                const Tensor& known_host_offsets) {
  const Tensor host_offsets =
      NeedsHostOffsets() ? HostOffsets(offsets, known_host_offsets) : Tensor();
  const std::span<const int32_t> host_rows = OffsetValues(host_offsets);
  const int64_t n = x_rows.rows(), ffn = config_.moe_ffn_hidden_size;
  const DType dtype = x_rows.values.dtype();
  const Device device = x_rows.values.device();
  saved.Save(Key(".offsets", segment), offsets);
  if (host_offsets.defined()) saved.Save(Key(".host_offsets", segment), host_offsets);
  saved.Save(Key(".weights", segment), weights);

  ScopedSaveGroup group(saved, kFusedGroupMlpGroup, layer_);
  const bool keep_a = !config_.recompute_in(layer_).moe_act;
  if (fp8()) {
    fc1_fp8_.Refresh(fc1_.value, parameters_.values_version());
    fc2_fp8_.Refresh(fc2_.value, parameters_.values_version());
    Fp8Rows xq;  // fc1's operand; the weight gradient's (x's columns) is saved
    SaveColumns(saved, ".x", segment, QuantizeColumns(x_rows, offsets, &xq));
    const Tensor h = fc1_fp8_.Forward(xq, offsets, dtype);
    saved.Save(Key(".h", segment), h);
    Fp8Rows aq;  // fc2's operand, from h without a in memory; a's columns saved unless recomputed
    const Fp8Columns a_columns = QuantizeSwiglu(h, weights, offsets, &aq, keep_a);
    if (keep_a) SaveColumns(saved, ".a", segment, a_columns);
    return fc2_fp8_.Forward(aq, offsets, dtype);
  }
  const Tensor x = x_rows.Gathered();
  saved.Save(Key(".x", segment), x);
  Tensor h = Tensor::Empty({n, 2 * ffn}, dtype, device);
  Tensor a = Tensor::Empty({n, ffn}, dtype, device);
  ops::GroupedMatmulSwiglu(x, fc1_.value, offsets, host_rows, weights, h, a);
  saved.Save(Key(".h", segment), h);
  if (keep_a) saved.Save(Key(".a", segment), a);
  Tensor y = Tensor::Empty({n, config_.hidden_size}, dtype, device);
  ops::GroupedMatmul(a, fc2_.value, offsets, host_rows, y, /*transpose_w=*/true);
  return y;
}

bool FusedGroupedMlp::fp8() const { return config_.fp8_recipe == Fp8Recipe::kBlockwise; }

void FusedGroupedMlp::SaveColumns(SavedTensors& saved, const char* what, int segment,
                                  const Fp8Columns& columns) const {
  saved.Save(Key(what, segment), columns.q);
  saved.Save(Key((std::string(what) + "_scales").c_str(), segment), columns.scales);
}

Fp8Columns FusedGroupedMlp::LoadColumns(SavedTensors& saved, const char* what, int segment,
                                        int64_t rows) const {
  return {saved.Load(Key(what, segment)),
          saved.Load(Key((std::string(what) + "_scales").c_str(), segment)), rows};
}

FusedGroupedMlp::SavedSegment FusedGroupedMlp::LoadSegment(SavedTensors& saved, int segment) const {
  SavedSegment s;
  s.offsets = saved.Load(Key(".offsets", segment));
  s.host_offsets = NeedsHostOffsets() ? saved.Load(Key(".host_offsets", segment)) : Tensor();
  s.weights = saved.Load(Key(".weights", segment));
  s.h = saved.Load(Key(".h", segment));
  return s;
}

Tensor FusedGroupedMlp::RecomputedA(const SavedSegment& s) const {
  Tensor a = Tensor::Empty({s.h.dim(0), config_.moe_ffn_hidden_size}, s.h.dtype(), s.h.device());
  ops::SwigluForward(s.h, s.weights, a);
  return a;
}

GroupedMlp::Grads FusedGroupedMlp::Fp8BackwardSegment(SavedTensors& saved, const PermutedRows& dy,
                                                      int segment) {
  const SavedSegment s = LoadSegment(saved, segment);
  const DType dtype = s.h.dtype();
  const int64_t rows = s.h.dim(0);
  const Fp8Columns a =
      config_.recompute_in(layer_).moe_act
          ? QuantizeSwiglu(s.h, s.weights, s.offsets, /*row_tiles=*/nullptr, /*columns=*/true)
          : LoadColumns(saved, ".a", segment, rows);
  Grads grads;
  Fp8Rows dyq, dhq;  // the input gradients' operands; their columns wait for the weight gradients
  const Fp8Columns dy_columns = QuantizeColumns(dy, s.offsets, &dyq);
  grads.dweights = Tensor::Empty(s.weights.shape(), DType::kF32, s.h.device());
  const Fp8Columns dh_columns = QuantizeSwigluGradient(
      fc2_fp8_.InputGrad(dyq, s.offsets, dtype), s.h, s.weights, s.offsets, dhq, grads.dweights);
  grads.dx = fc1_fp8_.InputGrad(dhq, s.offsets, dtype);

  PendingWeightGrads pending;
  pending.fc2_fp8 = {dy_columns, a, s.offsets};
  pending.fc1_fp8 = {dh_columns, LoadColumns(saved, ".x", segment, rows), s.offsets};
  pending.segment = segment;
  pending_.push_back(std::move(pending));
  return grads;
}

GroupedMlp::Grads FusedGroupedMlp::BackwardSegment(SavedTensors& saved, const PermutedRows& dy_rows,
                                                   int segment) {
  if (fp8()) return Fp8BackwardSegment(saved, dy_rows, segment);
  const Tensor dy = dy_rows.Gathered();
  const SavedSegment s = LoadSegment(saved, segment);
  const std::span<const int32_t> host_rows = OffsetValues(s.host_offsets);
  const Device device = dy.device();
  const Tensor a =
      config_.recompute_in(layer_).moe_act ? RecomputedA(s) : saved.Load(Key(".a", segment));

  Grads grads;
  Tensor dh = Tensor::Empty(s.h.shape(), s.h.dtype(), device);
  grads.dweights = Tensor::Empty(s.weights.shape(), DType::kF32, device);
  ops::GroupedMatmulSwigluBackward(dy, fc2_.value, s.offsets, host_rows, s.h, s.weights, dh,
                                   grads.dweights);

  const Tensor x = saved.Load(Key(".x", segment));
  grads.dx = Tensor::Empty(x.shape(), x.dtype(), device);
  ops::GroupedMatmul(dh, fc1_.value, s.offsets, host_rows, grads.dx, /*transpose_w=*/false);

  PendingWeightGrads pending;
  pending.fc2 = {dy, a, s.offsets, host_rows};
  pending.fc1 = {dh, x, s.offsets, host_rows};
  pending.host_offsets = s.host_offsets;
  pending.segment = segment;
  pending_.push_back(std::move(pending));
  return grads;
}

void FusedGroupedMlp::EndBackward(bool last_of_step) {
  ++pending_micro_batches_;
  if (last_of_step || pending_micro_batches_ >= config_.moe_wgrad_micro_batches) AddWeightGrads();
  if (last_of_step) SumGradSlots();
}

void FusedGroupedMlp::AddWeightGrads() {
  pending_micro_batches_ = 0;
  const TraceSpan span(fc1_.value.device(), "moe weight gradients", layer_);
  // Every pending part in one pass per weight, or with source slots one pass per source.
  const int passes = UsesGradSlots() ? shard_.sources : 1;
  for (int source = 0; source < passes; ++source) {
    // One weight's parts (of this source's segment where there are several).
    const auto in_pass = [&](const PendingWeightGrads& p) {
      return passes == 1 || p.segment == source;
    };
    if (std::ranges::none_of(pending_, in_pass)) continue;
    const auto parts = [&]<typename Part>(Part PendingWeightGrads::*part) {
      std::vector<Part> out;
      for (const PendingWeightGrads& p : pending_) {
        if (in_pass(p)) out.push_back(p.*part);
      }
      return out;
    };
    const GradTarget fc2 = WeightGradTarget(fc2_, source);
    const GradTarget fc1 = WeightGradTarget(fc1_, source);
    if (fp8()) {
      AddFp8WeightGrads(parts(&PendingWeightGrads::fc2_fp8), fc2.grad, fc2.accumulate);
      AddFp8WeightGrads(parts(&PendingWeightGrads::fc1_fp8), fc1.grad, fc1.accumulate);
    } else {
      ops::GroupedMatmulWeightGrad(parts(&PendingWeightGrads::fc2), fc2.grad, fc2.accumulate);
      ops::GroupedMatmulWeightGrad(parts(&PendingWeightGrads::fc1), fc1.grad, fc1.accumulate);
    }
  }
  pending_.clear();
}

}  // namespace moe
