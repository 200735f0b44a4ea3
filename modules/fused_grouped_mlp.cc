#include "modules/fused_grouped_mlp.h"

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
                                const Tensor& weights) {
  const Tensor host_offsets = NeedsHostOffsets() ? HostOffsets(offsets) : Tensor();
  const std::span<const int32_t> host_rows = OffsetValues(host_offsets);
  const int64_t n = x.dim(0), ffn = config_.moe_ffn_hidden_size;
  const Device device = x.device();
  saved.Save(name_ + ".offsets", offsets);
  if (host_offsets.defined()) saved.Save(name_ + ".host_offsets", host_offsets);
  saved.Save(name_ + ".weights", weights);

  ScopedSaveGroup group(saved, kFusedGroupMlpGroup, layer_);
  saved.Save(name_ + ".x", x);
  Tensor h = Tensor::Empty({n, 2 * ffn}, x.dtype(), device);
  Tensor a = Tensor::Empty({n, ffn}, x.dtype(), device);
  ops::GroupedMatmulSwiglu(x, fc1_.value, offsets, host_rows, weights, h, a);
  saved.Save(name_ + ".h", h);
  if (!config_.recompute_in(layer_).moe_act) saved.Save(name_ + ".a", a);
  Tensor y = Tensor::Empty({n, config_.hidden_size}, x.dtype(), device);
  ops::GroupedMatmul(a, fc2_.value, offsets, host_rows, y, /*transpose_w=*/true);
  return y;
}

GroupedMlp::Grads FusedGroupedMlp::Backward(SavedTensors& saved, const Tensor& dy,
                                            bool last_of_step) {
  const Tensor offsets = saved.Load(name_ + ".offsets");
  const Tensor host_offsets = NeedsHostOffsets() ? saved.Load(name_ + ".host_offsets") : Tensor();
  const std::span<const int32_t> host_rows = OffsetValues(host_offsets);
  const Tensor weights = saved.Load(name_ + ".weights");
  const Device device = dy.device();

  const Tensor h = saved.Load(name_ + ".h");
  Tensor a;
  if (config_.recompute_in(layer_).moe_act) {
    a = Tensor::Empty({h.dim(0), config_.moe_ffn_hidden_size}, h.dtype(), device);
    ops::SwigluForward(h, weights, a);
  } else {
    a = saved.Load(name_ + ".a");
  }

  Grads grads;
  Tensor dh = Tensor::Empty(h.shape(), h.dtype(), device);
  grads.dweights = Tensor::Empty(weights.shape(), DType::kF32, device);
  ops::GroupedMatmulSwigluBackward(dy, fc2_.value, offsets, host_rows, h, weights, dh,
                                   grads.dweights);

  const Tensor x = saved.Load(name_ + ".x");
  grads.dx = Tensor::Empty(x.shape(), x.dtype(), device);
  ops::GroupedMatmul(dh, fc1_.value, offsets, host_rows, grads.dx, /*transpose_w=*/false);

  pending_.push_back({{dy, a, offsets, host_rows}, {dh, x, offsets, host_rows}, host_offsets});
  if (last_of_step || static_cast<int64_t>(pending_.size()) >= config_.moe_wgrad_micro_batches) {
    AddWeightGrads();
  }
  return grads;
}

void FusedGroupedMlp::AddWeightGrads() {
  std::vector<ops::GroupedRows> fc2_parts, fc1_parts;
  for (const PendingWeightGrads& p : pending_) {
    fc2_parts.push_back(p.fc2);
    fc1_parts.push_back(p.fc1);
  }
  ops::GroupedMatmulWeightGrad(fc2_parts, fc2_.grad, BeginGradWrite(fc2_));
  ops::GroupedMatmulWeightGrad(fc1_parts, fc1_.grad, BeginGradWrite(fc1_));
  pending_.clear();
}

}  // namespace moe
