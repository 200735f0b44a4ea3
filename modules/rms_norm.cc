#include "modules/rms_norm.h"

#include "engine/kernels/ops.h"

namespace moe {

RmsNorm::RmsNorm(ParameterSet& parameters, const std::string& name, int64_t hidden, float eps)
    : name_(name),
      weight_(parameters.Create({name + ".weight", {hidden}, Init::kOnes, 0, /*decay=*/false})),
      eps_(eps) {}

Tensor RmsNorm::Forward(SavedTensors& saved, const Tensor& x, const Tensor& residual) {
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::Empty({x.dim(0)}, DType::kF32, x.device());
  ops::RmsNormForward(x, weight_.value, eps_, y, rstd, residual);
  saved.Save(name_ + ".x", x);
  saved.Save(name_ + ".rstd", rstd);
  return y;
}

Tensor RmsNorm::Recompute(const SavedTensors& saved) const {
  const Tensor& x = saved.Peek(name_ + ".x");
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::Empty({x.dim(0)}, DType::kF32, x.device());
  ops::RmsNormForward(x, weight_.value, eps_, y, rstd);
  return y;
}

Tensor RmsNorm::Backward(SavedTensors& saved, const Tensor& dy, const Tensor& residual) {
  const Tensor x = saved.Load(name_ + ".x");
  const Tensor rstd = saved.Load(name_ + ".rstd");
  Tensor dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
  ops::RmsNormBackward(dy, x, weight_.value, rstd, dx, MaterializedGrad(weight_), residual);
  return dx;
}

}  // namespace moe
