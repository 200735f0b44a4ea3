#include "modules/fused_grouped_mlp.h"

#include <string>
#include <vector>

#include "engine/kernels/ops.h"
#include "modules/offload_groups.h"

namespace moe {

bool FusedGroupedMlp::NeedsHostOffsets() const {
  const Tensor& fc1 = fc1_.value;
  const Tensor& fc2 = fc2_.value;
  return ops::GroupedMatmulNeedsHostOffsets(fc1.device(), fc1.dtype(), fc1.shape()) ||
         ops::GroupedMatmulNeedsHostOffsets(fc2.device(), fc2.dtype(), fc2.shape());
}

Tensor FusedGroupedMlp::Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets,
                                const Tensor& weights, int segment,
                                const Tensor& known_host_offsets) {
  const Tensor host_offsets =
      NeedsHostOffsets() ? HostOffsets(offsets, known_host_offsets) : Tensor();
  const std::span<const int32_t> host_rows = OffsetValues(host_offsets);
  const int64_t n = x.dim(0), ffn = config_.moe_ffn_hidden_size;
  const Device device = x.device();
  saved.Save(Key(".offsets", segment), offsets);
  if (host_offsets.defined()) saved.Save(Key(".host_offsets", segment), host_offsets);
  saved.Save(Key(".weights", segment), weights);

  ScopedSaveGroup group(saved, kFusedGroupMlpGroup, layer_);
  const bool keep_a = !config_.recompute_in(layer_).moe_act;
  if (fp8()) {
    fc1_fp8_.Refresh(fc1_.value, parameters_.values_version());
    fc2_fp8_.Refresh(fc2_.value, parameters_.values_version());
    const Fp8Rows xq = QuantizeRows(x);
    SaveRows(saved, ".x", segment, xq);
    const Tensor h = fc1_fp8_.Forward(xq, offsets, x.dtype());
    saved.Save(Key(".h", segment), h);
    Fp8Rows aq;
    {  // a itself is freed before fc2's output exists
      Tensor a = Tensor::Empty({n, ffn}, x.dtype(), device);
      ops::SwigluForward(h, weights, a);
      aq = QuantizeRows(a);
    }
    if (keep_a) SaveRows(saved, ".a", segment, aq);
    return fc2_fp8_.Forward(aq, offsets, x.dtype());
  }
  saved.Save(Key(".x", segment), x);
  Tensor h = Tensor::Empty({n, 2 * ffn}, x.dtype(), device);
  Tensor a = Tensor::Empty({n, ffn}, x.dtype(), device);
  ops::GroupedMatmulSwiglu(x, fc1_.value, offsets, host_rows, weights, h, a);
  saved.Save(Key(".h", segment), h);
  if (keep_a) saved.Save(Key(".a", segment), a);
  Tensor y = Tensor::Empty({n, config_.hidden_size}, x.dtype(), device);
  ops::GroupedMatmul(a, fc2_.value, offsets, host_rows, y, /*transpose_w=*/true);
  return y;
}

bool FusedGroupedMlp::fp8() const { return config_.fp8_recipe == Fp8Recipe::kBlockwise; }

void FusedGroupedMlp::SaveRows(SavedTensors& saved, const char* what, int segment,
                               const Fp8Rows& rows) const {
  saved.Save(Key(what, segment), rows.q);
  saved.Save(Key((std::string(what) + "_scales").c_str(), segment), rows.scales);
}

Fp8Rows FusedGroupedMlp::LoadRows(SavedTensors& saved, const char* what, int segment) const {
  return {saved.Load(Key(what, segment)),
          saved.Load(Key((std::string(what) + "_scales").c_str(), segment))};
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

GroupedMlp::Grads FusedGroupedMlp::Fp8BackwardSegment(SavedTensors& saved, const Tensor& dy,
                                                      int segment) {
  const SavedSegment s = LoadSegment(saved, segment);
  const DType dtype = s.h.dtype();
  const Fp8Rows aq = config_.recompute_in(layer_).moe_act ? QuantizeRows(RecomputedA(s))
                                                          : LoadRows(saved, ".a", segment);
  Grads grads;
  const Tensor da = fc2_fp8_.InputGrad(QuantizeRows(dy), s.offsets, dtype);
  Tensor dh = Tensor::Empty(s.h.shape(), dtype, s.h.device());
  grads.dweights = Tensor::Empty(s.weights.shape(), DType::kF32, s.h.device());
  ops::SwigluBackward(da, s.h, s.weights, dh, grads.dweights);
  grads.dx = fc1_fp8_.InputGrad(QuantizeRows(dh), s.offsets, dtype);

  // The weight gradients take x and a as the forward's GEMMs saw them, dequantised when added.
  const std::span<const int32_t> host_rows = OffsetValues(s.host_offsets);
  pending_.push_back({{dy, Tensor(), s.offsets, host_rows},
                      {dh, Tensor(), s.offsets, host_rows},
                      s.host_offsets,
                      segment,
                      aq,
                      LoadRows(saved, ".x", segment)});
  return grads;
}

GroupedMlp::Grads FusedGroupedMlp::BackwardSegment(SavedTensors& saved, const Tensor& dy,
                                                   int segment) {
  if (fp8()) return Fp8BackwardSegment(saved, dy, segment);
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

  pending_.push_back({{dy, a, s.offsets, host_rows},
                      {dh, x, s.offsets, host_rows},
                      s.host_offsets,
                      segment,
                      {},
                      {}});
  return grads;
}

void FusedGroupedMlp::EndBackward(bool last_of_step) {
  ++pending_micro_batches_;
  if (last_of_step || pending_micro_batches_ >= config_.moe_wgrad_micro_batches) AddWeightGrads();
  if (last_of_step) SumGradSlots();
}

void FusedGroupedMlp::AddWeightGrads() {
  pending_micro_batches_ = 0;
  // Every pending part in one pass per weight, or with source slots one pass per source.
  const int passes = UsesGradSlots() ? shard_.sources : 1;
  for (int source = 0; source < passes; ++source) {
    // One weight's parts; FP8 rows dequantised now, one weight's at a time.
    const auto parts = [&](ops::GroupedRows PendingWeightGrads::*rows,
                           Fp8Rows PendingWeightGrads::*fp8_x) {
      std::vector<ops::GroupedRows> out;
      for (const PendingWeightGrads& p : pending_) {
        if (passes > 1 && p.segment != source) continue;
        out.push_back(p.*rows);
        if ((p.*fp8_x).q.defined()) out.back().x = Dequantized(p.*fp8_x, out.back().dy.dtype());
      }
      return out;
    };
    std::vector<ops::GroupedRows> fc2_parts =
        parts(&PendingWeightGrads::fc2, &PendingWeightGrads::fc2_x);
    if (fc2_parts.empty()) continue;
    const GradTarget fc2 = WeightGradTarget(fc2_, source);
    ops::GroupedMatmulWeightGrad(fc2_parts, fc2.grad, fc2.accumulate);
    fc2_parts.clear();  // a dequantised is freed before x is
    const GradTarget fc1 = WeightGradTarget(fc1_, source);
    ops::GroupedMatmulWeightGrad(parts(&PendingWeightGrads::fc1, &PendingWeightGrads::fc1_x),
                                 fc1.grad, fc1.accumulate);
  }
  pending_.clear();
}

}  // namespace moe
