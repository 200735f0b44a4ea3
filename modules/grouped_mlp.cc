#include "modules/grouped_mlp.h"

#include <cmath>

#include "engine/kernels/ops.h"
#include "modules/linear.h"

namespace moe {

GroupedMlp::GroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                       int layer)
    : name_(name),
      config_(config),
      layer_(layer),
      fc1_(parameters.Create({name + ".fc1.weight",
                              {config.num_experts, 2 * config.moe_ffn_hidden_size, config.hidden_size},
                              Init::kNormal, config.init_std})),
      fc2_(parameters.Create({name + ".fc2.weight",
                              {config.num_experts, config.hidden_size, config.moe_ffn_hidden_size},
                              Init::kNormal,
                              config.init_std / std::sqrt(2.0f * static_cast<float>(config.num_layers))})) {}

std::vector<int32_t> GroupedMlp::HostOffsets(const Tensor& offsets) const {
  std::vector<int32_t> host(offsets.numel());
  ops::CopyToHost(offsets, host.data());
  return host;
}

// Expert e's matrix of a stacked (experts, out, in) tensor.
Tensor GroupedMlp::ExpertWeight(const Parameter& p, const Tensor& t, int64_t expert) const {
  return t.Rows(expert, expert + 1).View({p.master.dim(1), p.master.dim(2)});
}

Tensor GroupedMlp::Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets,
                           const Tensor& weights) {
  const std::vector<int32_t> rows = HostOffsets(offsets);
  const int64_t ffn = config_.moe_ffn_hidden_size;
  Tensor h = Tensor::Empty({x.dim(0), 2 * ffn}, x.dtype(), x.device());
  saved.Save(name_ + ".offsets", offsets);
  {
    ScopedSaveGroup group(saved, "expert_fc1", layer_);
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      if (rows[e] == rows[e + 1]) continue;
      LinearForwardInto(x.Rows(rows[e], rows[e + 1]), ExpertWeight(fc1_, fc1_.value, e),
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
    LinearForwardInto(a.Rows(rows[e], rows[e + 1]), ExpertWeight(fc2_, fc2_.value, e),
                      y.Rows(rows[e], rows[e + 1]));
  }
  return y;
}

GroupedMlp::Grads GroupedMlp::Backward(SavedTensors& saved, const Tensor& dy) {
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
                   ExpertWeight(fc2_, fc2_.value, e), ExpertWeight(fc2_, fc2_.grad, e),
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
                   ExpertWeight(fc1_, fc1_.value, e), ExpertWeight(fc1_, fc1_.grad, e),
                   grads.dx.Rows(rows[e], rows[e + 1]), /*accumulate_dx=*/false);
  }
  return grads;
}

}  // namespace moe
