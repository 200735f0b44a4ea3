#include "modules/dense_mlp.h"

#include <cmath>

#include "engine/kernels/ops.h"
#include "modules/linear.h"

namespace moe {

DenseMlp::DenseMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config)
    : name_(name),
      fc1_(parameters.Create({name + ".fc1.weight",
                              {2 * config.ffn_hidden_size, config.hidden_size},
                              Init::kNormal,
                              config.init_std})),
      fc2_(parameters.Create(
          {name + ".fc2.weight",
           {config.hidden_size, config.ffn_hidden_size},
           Init::kNormal,
           config.init_std / std::sqrt(2.0f * static_cast<float>(config.num_layers))})) {}

Tensor DenseMlp::Forward(SavedTensors& saved, const Tensor& x) {
  const Tensor h = LinearForward(x, fc1_);
  Tensor a = Tensor::Empty({x.dim(0), h.dim(1) / 2}, x.dtype(), x.device());
  ops::SwigluForward(h, Tensor(), a);
  saved.Save(name_ + ".x", x);
  saved.Save(name_ + ".h", h);
  return LinearForward(a, fc2_);
}

Tensor DenseMlp::Backward(SavedTensors& saved, const Tensor& dy) {
  const Tensor h = saved.Load(name_ + ".h");
  Tensor a = Tensor::Empty({h.dim(0), h.dim(1) / 2}, h.dtype(), h.device());
  ops::SwigluForward(h, Tensor(), a);
  const Tensor da = LinearBackward(dy, a, fc2_);
  Tensor dh = Tensor::Empty(h.shape(), h.dtype(), h.device());
  ops::SwigluBackward(da, h, Tensor(), dh, Tensor());
  return LinearBackward(dh, saved.Load(name_ + ".x"), fc1_);
}

}  // namespace moe
