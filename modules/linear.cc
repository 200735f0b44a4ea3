#include "modules/linear.h"

#include "engine/kernels/ops.h"

namespace moe {

void LinearForwardInto(const Tensor& x, const Tensor& weight, const Tensor& y) {
  ops::Matmul(x, weight, y, /*transpose_a=*/false, /*transpose_b=*/true);
}

Tensor LinearForward(const Tensor& x, const Parameter& weight) {
  Tensor y = Tensor::Empty({x.dim(0), weight.value.dim(0)}, x.dtype(), x.device());
  LinearForwardInto(x, weight.value, y);
  return y;
}

void LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dweight,
                    const Tensor& dx, bool accumulate_dx, bool accumulate_dweight) {
  ops::Matmul(dy, weight, dx, false, false, accumulate_dx ? 1.0f : 0.0f);
  ops::Matmul(dy, x, dweight, /*transpose_a=*/true, false, accumulate_dweight ? 1.0f : 0.0f);
}

void LinearBackward(const Tensor& dy, const Tensor& x, Parameter& weight, const Tensor& dx,
                    bool accumulate_dx) {
  LinearBackward(dy, x, weight.value, weight.grad, dx, accumulate_dx, BeginGradWrite(weight));
}

Tensor LinearBackward(const Tensor& dy, const Tensor& x, Parameter& weight) {
  Tensor dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
  LinearBackward(dy, x, weight, dx, /*accumulate_dx=*/false);
  return dx;
}

}  // namespace moe
