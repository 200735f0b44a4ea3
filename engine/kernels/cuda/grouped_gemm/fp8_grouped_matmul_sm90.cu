// CUDA Fp8GroupedMatmul and Fp8GroupedMatmulWeightGrad (contracts:
// engine/kernels/op_declarations.inc): the Hopper FP8 grouped GEMMs of fp8_grouped_gemm_sm90.cuh,
// which has no fallback: other devices, and shapes or alignments it does not take, fail with a
// message naming the requirement. When the build has architecture 90, engine/CMakeLists.txt
// compiles this file for sm_90a alone (its name has sm90).
#include <algorithm>
#include <vector>

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
  CHECK(k > 0 && k % kFp8RowAlignment == 0)
      << "CUDA fp8 grouped matmul needs k (" << k << ") a positive multiple of " << kFp8RowAlignment
      << " (TMA: 16-byte row strides)";
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

void Fp8GroupedMatmulWeightGrad(std::span<const Fp8GroupedColumns> parts, const Tensor& dw,
                                bool accumulate) {
  const int64_t groups = dw.dim(0), n = dw.dim(1), k = dw.dim(2);
  CHECK(Sm90aKernelsRunOn(dw.device().index))
      << "CUDA fp8 grouped weight gradient needs the sm_90a kernels: a build with architecture 90 "
         "and a compute capability 9.0 device";
  CHECK(n % kFp8RowAlignment == 0 && k % kFp8RowAlignment == 0)
      << "CUDA fp8 grouped weight gradient needs n (" << n << ") and k (" << k << ") multiples of "
      << kFp8RowAlignment << " (the scales' bulk copies, 16-byte rows)";
  CHECK(groups >= 1 && groups <= sm90::kMaxGroups) << "CUDA fp8 grouped weight gradient takes 1 to "
                                                   << sm90::kMaxGroups << " groups, not " << groups;
  CHECK(sm90::detail::FitsInt(n) && sm90::detail::FitsInt(k))
      << "CUDA fp8 grouped weight gradient sizes must be below 2^31";
  CHECK(Aligned16(dw.data())) << "CUDA fp8 grouped weight gradient needs dw 16-byte aligned";
  std::vector<sm90::Fp8WeightGradRows> rows;
  for (const Fp8GroupedColumns& part : parts) {
    CHECK(part.x_q.dim(1) == part.dy_q.dim(1) && sm90::detail::FitsInt(part.dy_q.dim(1)))
        << "CUDA fp8 grouped weight gradient needs dy_q and x_q of one part padded alike, to "
           "fewer than 2^31 rows: "
        << part.dy_q.DebugString() << ", " << part.x_q.DebugString();
    CHECK(Aligned16(part.dy_q.data()) && Aligned16(part.x_q.data()) &&
          Aligned16(part.dy_scales.data()) && Aligned16(part.x_scales.data()))
        << "CUDA fp8 grouped weight gradient needs dy_q, x_q and their scales 16-byte aligned "
           "(TMA and bulk copies)";
    rows.push_back({Ptr<const uint8_t>(part.dy_q), Ptr<const float>(part.dy_scales),
                    Ptr<const uint8_t>(part.x_q), Ptr<const float>(part.x_scales),
                    Ptr<const int32_t>(part.offsets), part.rows, part.dy_q.dim(1)});
  }
  const cudaStream_t stream = StreamOf(dw);
  // One launch per kMaxWeightGradParts parts (ops checked there is one at least); the later ones
  // add to what the first wrote.
  const int launch_groups = static_cast<int>(groups);
  for (size_t first = 0; first < rows.size(); first += sm90::kMaxWeightGradParts) {
    const int count =
        static_cast<int>(std::min<size_t>(sm90::kMaxWeightGradParts, rows.size() - first));
    const bool add = accumulate || first > 0;
    DispatchFloat(dw.dtype(), [&]<typename T>(TypeTag<T>) {
      MOE_CUDA_CALL(sm90::Fp8GroupedMatmulWeightGradSm90(rows.data() + first, count, launch_groups,
                                                         n, k, add, Ptr<T>(dw), stream));
    });
  }
}

}  // namespace moe::cuda
