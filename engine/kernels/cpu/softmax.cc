// CPU row softmax, f32 with double row sums.
//   SoftmaxForward: y = exp(x - max) / sum (rows, cols). SoftmaxBackward: dx = y * (dy - <dy, y>).
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

void SoftmaxForward(const Tensor& x, const Tensor& y) {
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * cols;
    float* yr = y.data<float>() + r * cols;
    const float max = *std::max_element(xr, xr + cols);
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      yr[j] = std::exp(xr[j] - max);
      sum += yr[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

void SoftmaxBackward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  const int64_t cols = y.dim(-1), rows = y.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy.data<float>() + r * cols;
    const float* yr = y.data<float>() + r * cols;
    float* dxr = dx.data<float>() + r * cols;
    double dot = 0;
    for (int64_t j = 0; j < cols; ++j) dot += static_cast<double>(dyr[j]) * yr[j];
    for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - static_cast<float>(dot));
  }
}

}  // namespace moe::cpu
