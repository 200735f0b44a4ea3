#include "modules/unfused_grouped_mlp.h"

#include "engine/kernels/ops.h"
#include "modules/linear.h"
#include "modules/offload_groups.h"

namespace moe {

namespace {

// For every expert with rows: y_e = x_e w_e^T.  x (rows, in); w (experts, out, in); y (rows, out).
void PerExpertForward(std::span<const int32_t> rows, const Tensor& x, const Parameter& w,
                      const Tensor& y) {
  for (size_t e = 0; e + 1 < rows.size(); ++e) {
    if (rows[e] == rows[e + 1]) continue;
    LinearForwardInto(x.Rows(rows[e], rows[e + 1]), ExpertMatrix(w, w.value, e),
                      y.Rows(rows[e], rows[e + 1]));
  }
}

// For every expert with rows: dx_e = dy_e w_e (=), grad_e += dy_e^T x_e (or = unless
// accumulate; then an expert without rows gets zeros). grad: w.grad or a slot of its shape.
void PerExpertBackward(std::span<const int32_t> rows, const Tensor& dy, const Tensor& x,
                       const Parameter& w, const Tensor& grad, bool accumulate, const Tensor& dx) {
  for (size_t e = 0; e + 1 < rows.size(); ++e) {
    const Tensor dw = ExpertMatrix(w, grad, e);
    if (rows[e] == rows[e + 1]) {
      if (!accumulate) ops::Fill(dw, 0.0f);
      continue;
    }
    LinearBackward(dy.Rows(rows[e], rows[e + 1]), x.Rows(rows[e], rows[e + 1]),
                   ExpertMatrix(w, w.value, e), dw, dx.Rows(rows[e], rows[e + 1]),
                   /*accumulate_dx=*/false, accumulate);
  }
}

}  // namespace

Tensor UnfusedGroupedMlp::Forward(SavedTensors& saved, const PermutedRows& x_rows,
                                  const Tensor& offsets, const Tensor& weights, int segment,
                                  const Tensor& known_host_offsets) {
  const Tensor x = x_rows.Gathered();
  const Tensor host_offsets = HostOffsets(offsets, known_host_offsets);
  const std::span<const int32_t> rows = OffsetValues(host_offsets);
  const int64_t ffn = config_.moe_ffn_hidden_size;
  Tensor h = Tensor::Empty({x.dim(0), 2 * ffn}, x.dtype(), x.device());
  saved.Save(Key(".offsets", segment), host_offsets);
  {
    ScopedSaveGroup group(saved, kExpertFc1Group, layer_);
    PerExpertForward(rows, x, fc1_, h);
    saved.Save(Key(".x", segment), x);
  }
  ScopedSaveGroup group(saved, kMoeActGroup, layer_);
  Tensor a = Tensor::Empty({x.dim(0), ffn}, x.dtype(), x.device());
  ops::SwigluForward(h, weights, a);
  saved.Save(Key(".h", segment), h);
  saved.Save(Key(".weights", segment), weights);
  Tensor y = Tensor::Empty({x.dim(0), config_.hidden_size}, x.dtype(), x.device());
  PerExpertForward(rows, a, fc2_, y);
  return y;
}

GroupedMlp::Grads UnfusedGroupedMlp::BackwardSegment(SavedTensors& saved,
                                                     const PermutedRows& dy_rows, int segment) {
  const Tensor dy = dy_rows.Gathered();
  const Tensor host_offsets = saved.Load(Key(".offsets", segment));
  const std::span<const int32_t> rows = OffsetValues(host_offsets);
  const Tensor weights = saved.Load(Key(".weights", segment));
  const Tensor h = saved.Load(Key(".h", segment));
  const Device device = dy.device();

  Tensor a = Tensor::Empty({h.dim(0), h.dim(1) / 2}, h.dtype(), device);
  ops::SwigluForward(h, weights, a);  // recompute fc2's input
  Tensor da = Tensor::Empty(a.shape(), a.dtype(), device);
  const GradTarget fc2 = WeightGradTarget(fc2_, segment);
  PerExpertBackward(rows, dy, a, fc2_, fc2.grad, fc2.accumulate, da);
  Grads grads;
  Tensor dh = Tensor::Empty(h.shape(), h.dtype(), device);
  grads.dweights = Tensor::Empty(weights.shape(), DType::kF32, device);
  ops::SwigluBackward(da, h, weights, dh, grads.dweights);

  const Tensor x = saved.Load(Key(".x", segment));
  grads.dx = Tensor::Empty(x.shape(), x.dtype(), device);
  const GradTarget fc1 = WeightGradTarget(fc1_, segment);
  PerExpertBackward(rows, dh, x, fc1_, fc1.grad, fc1.accumulate, grads.dx);
  return grads;
}

void UnfusedGroupedMlp::EndBackward(bool last_of_step) {
  if (last_of_step) SumGradSlots();
}

}  // namespace moe
