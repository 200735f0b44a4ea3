#include "modules/unfused_grouped_mlp.h"

#include "engine/kernels/ops.h"
#include "modules/linear.h"

namespace moe {

UnfusedGroupedMlp::UnfusedGroupedMlp(ParameterSet& parameters, const std::string& name,
                                     const GptConfig& config, int layer)
    : name_(name), config_(config), layer_(layer), weights_(CreateExpertWeights(parameters, name, config)) {}

Tensor UnfusedGroupedMlp::Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets,
                           const Tensor& weights) {
  const std::vector<int32_t> rows = HostOffsets(offsets);
  const int64_t ffn = config_.moe_ffn_hidden_size;
  Tensor h = Tensor::Empty({x.dim(0), 2 * ffn}, x.dtype(), x.device());
  saved.Save(name_ + ".offsets", offsets);
  {
    ScopedSaveGroup group(saved, "expert_fc1", layer_);
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      if (rows[e] == rows[e + 1]) continue;
      LinearForwardInto(x.Rows(rows[e], rows[e + 1]), ExpertMatrix(weights_.fc1, weights_.fc1.value, e),
                        h.Rows(rows[e], rows[e + 1]));
    }
    saved.Save(name_ + ".x", x);
  }
  ScopedSaveGroup group(saved, "moe_act", layer_);
  Tensor a = Tensor::Empty({x.dim(0), ffn}, x.dtype(), x.device());
  ops::SwigluForward(h, weights, a);
  saved.Save(name_ + ".h", h);
  saved.Save(name_ + ".weights", weights);
  Tensor y = Tensor::Empty({x.dim(0), config_.hidden_size}, x.dtype(), x.device());
  for (int64_t e = 0; e < config_.num_experts; ++e) {
    if (rows[e] == rows[e + 1]) continue;
    LinearForwardInto(a.Rows(rows[e], rows[e + 1]), ExpertMatrix(weights_.fc2, weights_.fc2.value, e),
                      y.Rows(rows[e], rows[e + 1]));
  }
  return y;
}

GroupedMlp::Grads UnfusedGroupedMlp::Backward(SavedTensors& saved, const Tensor& dy) {
  const Tensor offsets = saved.Load(name_ + ".offsets");
  const Tensor weights = saved.Load(name_ + ".weights");
  const Tensor h = saved.Load(name_ + ".h");
  const std::vector<int32_t> rows = HostOffsets(offsets);
  const Device device = dy.device();

  Tensor a = Tensor::Empty({h.dim(0), h.dim(1) / 2}, h.dtype(), device);
  ops::SwigluForward(h, weights, a);  // recompute fc2's input
  Tensor da = Tensor::Empty(a.shape(), a.dtype(), device);
  for (int64_t e = 0; e < config_.num_experts; ++e) {
    if (rows[e] == rows[e + 1]) continue;
    LinearBackward(dy.Rows(rows[e], rows[e + 1]), a.Rows(rows[e], rows[e + 1]),
                   ExpertMatrix(weights_.fc2, weights_.fc2.value, e), ExpertMatrix(weights_.fc2, weights_.fc2.grad, e),
                   da.Rows(rows[e], rows[e + 1]), /*accumulate_dx=*/false);
  }
  Grads grads;
  Tensor dh = Tensor::Empty(h.shape(), h.dtype(), device);
  grads.dweights = Tensor::Empty(weights.shape(), DType::kF32, device);
  ops::SwigluBackward(da, h, weights, dh, grads.dweights);

  const Tensor x = saved.Load(name_ + ".x");
  grads.dx = Tensor::Empty(x.shape(), x.dtype(), device);
  for (int64_t e = 0; e < config_.num_experts; ++e) {
    if (rows[e] == rows[e + 1]) continue;
    LinearBackward(dh.Rows(rows[e], rows[e + 1]), x.Rows(rows[e], rows[e + 1]),
                   ExpertMatrix(weights_.fc1, weights_.fc1.value, e), ExpertMatrix(weights_.fc1, weights_.fc1.grad, e),
                   grads.dx.Rows(rows[e], rows[e + 1]), /*accumulate_dx=*/false);
  }
  return grads;
}

}  // namespace moe
