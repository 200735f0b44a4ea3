// CPU reductions.
//   Sum: out (1) = sum of x, accumulated in double. GlobalL2Norm: out (1) = sqrt of the sum of
//   squares over all tensors (f32 or bf16), in double, tensors in order. NaN propagates through
//   both.
#include <cmath>

#include "engine/core/bfloat16.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

void Sum(const Tensor& x, const Tensor& out) {
  const float* px = x.data<float>();
  double sum = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) sum += px[i];
  out.data<float>()[0] = static_cast<float>(sum);
}

void GlobalL2Norm(std::span<const Tensor> xs, const Tensor& out) {
  double sum_sq = 0;
  const auto add_squares = [&sum_sq](const auto* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const double v = ToFloat(p[i]);  // engine/core/bfloat16.h
      sum_sq += v * v;
    }
  };
  for (const Tensor& x : xs) {
    if (x.dtype() == DType::kBF16) {
      add_squares(x.data<BFloat16>(), x.numel());
    } else {
      add_squares(x.data<float>(), x.numel());
    }
  }
  out.data<float>()[0] = static_cast<float>(std::sqrt(sum_sq));
}

}  // namespace moe::cpu
