// CPU RMSNorm, f32 with double row sums.
//   RmsNormForward: x, y (rows, h); weight (h); rstd (rows) = 1 / sqrt(mean(x^2) + eps), saved;
//     x += residual first where given.
//   RmsNormBackward: dx = rstd * (w*dy - x * rstd^2 * mean(w*dy*x)) (=) + residual (if given);
//     dweight += sum_rows dy * x * rstd (dweight f32, or bf16 rounded once per call).
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/cpu_ops.h"
#include "engine/kernels/cpu/f32_output.h"

namespace moe::cpu {

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd, const Tensor& residual) {
  const int64_t h = x.dim(-1), rows = x.numel() / h;
  const float* w = weight.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data<float>() + r * h;
    float* yr = y.data<float>() + r * h;
    if (residual.defined()) {
      const float* res = residual.data<float>() + r * h;
      for (int64_t j = 0; j < h; ++j) xr[j] += res[j];
    }
    double sum_sq = 0;
    for (int64_t j = 0; j < h; ++j) sum_sq += static_cast<double>(xr[j]) * xr[j];
    const float s = static_cast<float>(1.0 / std::sqrt(sum_sq / h + eps));
    for (int64_t j = 0; j < h; ++j) yr[j] = xr[j] * s * w[j];
    rstd.data<float>()[r] = s;
  }
}

void RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                     const Tensor& dx, const Tensor& dweight, const Tensor& residual) {
  const int64_t h = x.dim(-1), rows = x.numel() / h;
  const float* w = weight.data<float>();
  const F32Output dweight_f32(dweight, /*read=*/true);
  float* dw = dweight_f32.f32().data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * h;
    const float* dyr = dy.data<float>() + r * h;
    float* dxr = dx.data<float>() + r * h;
    const float* res = residual.defined() ? residual.data<float>() + r * h : nullptr;
    const float s = rstd.data<float>()[r];
    double dot = 0;  // sum_j w dy x
    for (int64_t j = 0; j < h; ++j) dot += static_cast<double>(w[j]) * dyr[j] * xr[j];
    const float c = static_cast<float>(dot / h) * s * s;
    for (int64_t j = 0; j < h; ++j) {
      dw[j] += dyr[j] * xr[j] * s;
      dxr[j] = s * (w[j] * dyr[j] - xr[j] * c) + (res ? res[j] : 0.0f);
    }
  }
  dweight_f32.Commit();
}

}  // namespace moe::cpu
