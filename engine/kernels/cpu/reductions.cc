// CPU reductions.
//   Sum: out (1) = sum of x, accumulated in double. GlobalL2Norm: out (1) = sqrt of the sum of
//   squares over all tensors, in double, tensors in order. NaN propagates through both.
#include <cmath>

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
  for (const Tensor& x : xs) {
    const float* px = x.data<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) sum_sq += static_cast<double>(px[i]) * px[i];
  }
  out.data<float>()[0] = static_cast<float>(std::sqrt(sum_sq));
}

}  // namespace moe::cpu
