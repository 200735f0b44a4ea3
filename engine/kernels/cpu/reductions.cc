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
  for (const Tensor& x : xs) {
    DispatchStorage(x.dtype(), [&]<typename T>(StorageTag<T>) {
      const T* p = x.data<T>();
      for (int64_t i = 0, n = x.numel(); i < n; ++i) {
        const double v = ToFloat(p[i]);
        sum_sq += v * v;
      }
    });
  }
  out.data<float>()[0] = static_cast<float>(std::sqrt(sum_sq));
}

}  // namespace moe::cpu
