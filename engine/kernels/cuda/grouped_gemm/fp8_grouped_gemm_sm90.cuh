// The Hopper (sm_90a) FP8 grouped GEMM: the MoE expert layers' products on e4m3 operands with
// DeepSeek-V3's blockwise scaling (engine/kernels/fp8_scaling.h). Self-contained (CUDA headers
// only) so that tests/kernels/fp8_grouped_gemm_sm90_probe.cu builds it with one nvcc command; the
// engine's CUDA Fp8GroupedMatmul reaches it through fp8_grouped_matmul_sm90.cu (contract:
// op_declarations.inc). The kernel lies in sm90/fp8_forward_kernel.cuh and shares the bf16
// kernels' pieces (grouped_gemm_sm90.cuh's design note: the mbarrier stage protocol, TMA with the
// 128-byte swizzle, the K-major wgmma descriptors, the accumulator layout, the offsets' scan).
//
// Operation: group g owns the rows [offsets[g], offsets[g + 1]) (offsets (groups + 1) int32 in
// DEVICE memory; the kernel traps unless 0 = offsets[0] <= ... <= offsets[groups] = rows):
//   y[rows of g] (=) = xq[rows of g] · wq_g^T, xq (rows, k) e4m3, wq (groups, n, k) e4m3 (both
//   K-major), y (rows, n) f32 or bf16; x_scales (rows, ceil(k / 128)) f32, one per row and
//   128-wide K tile; w_scales (groups, ceil(n / 128), ceil(k / 128)) f32, one per 128 x 128 block.
//   Per output element, over the K tiles t in ascending order from acc = 0: partial_t = the
//   tile's e4m3 products summed by the tensor cores (wgmma, f32 accumulators fresh per tile, so no
//   reduced-precision sum runs longer than 128), acc = fma(partial_t, x_scale[row, t] *
//   w_scale[g, column / 128, t], acc); y = acc rounded to y's type (bf16: nearest even). Every
//   row of y is written (k == 0: zeros).
//   Requirements (the launcher returns cudaErrorInvalidValue otherwise): k a multiple of 16 and n
//   of 8, xq, wq and y 16-byte aligned (TMA: global strides and addresses multiples of 16 bytes;
//   the epilogue's column pairs); rows, n, k < 2^31; 1 <= groups <= kMaxGroups.
//
// Design (one CTA per SM, persistent, no cluster; tiles round-robin over the CTAs):
//   - Tile 128 x 128 of y (FindFp8Tile: group-major, then column tiles, then row tiles). A row
//     tile never crosses its group's end: rows past it are loaded (the next group's, or TMA's zero
//     fill past `rows`) but never stored; n and k tails are zero-filled by TMA (w is a 3-D map
//     with the group outermost, so no read crosses into the next expert), and zeros add nothing.
//   - CTA = 3 warpgroups: warpgroup 0's thread 0 produces (TMA into kFp8Stages stages of A 128 x
//     128 and B 128 x 128 e4m3: one K tile, 32 KiB), warpgroups 1 and 2 consume, 64 rows each.
//   - A stage's 128 e4m3 of K are one 128-byte swizzle row and one scale tile: per stage a
//     consumer issues 4 m64n128k32 wgmmas into fresh accumulators, waits for them, releases the
//     stage and promotes them into its f32 accumulators with one fma each (64 + 64 registers a
//     thread); the scales of the stage are loaded from global memory before it waits for it.
//   - Epilogue: each thread stores its accumulators' valid rows and columns as column pairs
//     (float2 or bf16x2) straight from registers.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_forward_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/persistent_launch.cuh"

namespace moe::cuda::sm90 {

// See the file comment: xq and wq as e4m3 bytes; Out (y's type) float or bf16. Asynchronous on
// `stream`; returns the first error of argument checks, tensor-map encoding or the launch.
template <typename Out>
cudaError_t Fp8GroupedMatmulSm90(const uint8_t* xq, const float* x_scales, const uint8_t* wq,
                                 const float* w_scales, const int32_t* offsets, int groups,
                                 int64_t rows, int64_t n, int64_t k, Out* y, cudaStream_t stream) {
  using namespace detail;
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>, "y is f32 or bf16");
  if (groups < 1 || groups > kMaxGroups || !FitsInt(rows) || !FitsInt(n) || !FitsInt(k) ||
      k % 16 != 0 || n % 8 != 0 || !Aligned16(xq) || !Aligned16(wq) || !Aligned16(y) ||
      offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || n == 0) return cudaSuccess;
  if (k == 0) return cudaMemsetAsync(y, 0, static_cast<size_t>(rows * n) * sizeof(Out), stream);
  if (x_scales == nullptr || w_scales == nullptr) return cudaErrorInvalidValue;
  const uint64_t g = static_cast<uint64_t>(groups), ur = static_cast<uint64_t>(rows);
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k);
  CUtensorMap x_map, w_map;
  cudaError_t status = EncodeTensorMap<2>(&x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, xq, {uk, ur}, {uk},
                                          {kFp8BlockK, kFp8BlockM});
  if (status != cudaSuccess) return status;
  status = EncodeTensorMap<3>(&w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, wq, {uk, un, g}, {uk, un * uk},
                              {kFp8BlockK, kFp8BlockN, 1});
  if (status != cudaSuccess) return status;
  // Tiles <= sum_g ceil(rows_g / kFp8BlockM) column tiles.
  const int64_t tiles = (rows + static_cast<int64_t>(groups) * (kFp8BlockM - 1)) / kFp8BlockM *
                        ((n + kFp8BlockN - 1) / kFp8BlockN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  constexpr auto kKernel = &Fp8GroupedMatmulKernel<Out>;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster;
  status = PersistentClusterLaunch<kKernel>(kFp8SmemBytes, 1, tiles, stream, &config, &cluster);
  if (status != cudaSuccess) return status;
  status = cudaLaunchKernelEx(&config, kKernel, x_map, w_map, x_scales, w_scales, offsets, groups,
                              static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k), y);
  return status != cudaSuccess ? status : cudaGetLastError();
}

}  // namespace moe::cuda::sm90
