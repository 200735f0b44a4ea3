// CUDA Fp8GroupedMatmul (contract: engine/kernels/op_declarations.inc): the Hopper FP8 grouped
// GEMM of fp8_grouped_gemm_sm90.cuh, which has no fallback: other devices, and shapes or
// alignments it does not take, fail with a message naming the requirement. When the build has
// architecture 90, engine/CMakeLists.txt compiles this file for sm_90a alone (its name has sm90).
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/common/sm90_device.h"
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/grouped_gemm/fp8_grouped_gemm_sm90.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda {

void Fp8GroupedMatmul(const Tensor& xq, const Tensor& x_scales, const Tensor& wq,
                      const Tensor& w_scales, const Tensor& offsets, const Tensor& y) {
  const int64_t rows = xq.dim(0), k = xq.dim(1), groups = wq.dim(0), n = wq.dim(1);
  CHECK(Sm90aKernelsRunOn(y.device().index))
      << "CUDA fp8 grouped matmul needs the sm_90a kernels: a build with architecture 90 and a "
         "compute capability 9.0 device";
  CHECK(k % kFp8RowAlignment == 0) << "CUDA fp8 grouped matmul needs k (" << k << ") a multiple of "
                                   << kFp8RowAlignment << " (TMA: 16-byte row strides)";
  CHECK(n % 8 == 0) << "CUDA fp8 grouped matmul needs n (" << n << ") a multiple of 8";
  CHECK(groups >= 1 && groups <= sm90::kMaxGroups)
      << "CUDA fp8 grouped matmul takes 1 to " << sm90::kMaxGroups << " groups, not " << groups;
  CHECK(Aligned16(xq.data()) && Aligned16(wq.data()) && Aligned16(y.data()))
      << "CUDA fp8 grouped matmul needs xq, wq and y 16-byte aligned (TMA)";
  CHECK(sm90::detail::FitsInt(rows) && sm90::detail::FitsInt(n) && sm90::detail::FitsInt(k))
      << "CUDA fp8 grouped matmul sizes must be below 2^31";
  DispatchFloat(y.dtype(), [&]<typename T>(TypeTag<T>) {
    MOE_CUDA_CALL(sm90::Fp8GroupedMatmulSm90(Ptr<const uint8_t>(xq), Ptr<const float>(x_scales),
                                             Ptr<const uint8_t>(wq), Ptr<const float>(w_scales),
                                             Ptr<const int32_t>(offsets), static_cast<int>(groups),
                                             rows, n, k, Ptr<T>(y), StreamOf(y)));
  });
}

}  // namespace moe::cuda
