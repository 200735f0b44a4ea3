// The host side of the Hopper grouped GEMMs' launches (design: ../grouped_gemm_sm90.cuh):
// argument checks, and each kernel's tensor maps and persistent launch (persistent_launch.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/forward_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/persistent_launch.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/split_k.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/swiglu_epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_parts.cuh"

namespace moe::cuda::sm90::detail {

// Whether the forward kernel takes these arguments (see grouped_gemm_sm90.cuh's requirements).
inline bool ForwardArgumentsValid(const bf16* x, const bf16* w, const bf16* y, int groups,
                                  int64_t rows, int64_t n, int64_t k) {
  return groups >= 1 && groups <= kMaxGroups && FitsInt(rows) && FitsInt(n) && FitsInt(k) &&
         n % 8 == 0 && k % 8 == 0 && Aligned16(x) && Aligned16(w) && Aligned16(y);
}

// The forward kernel's tensor maps (see GroupedMatmulKernel): x's, w's (by kTransposeW) and, for
// kStore and kSwiglu, y's (kSwigluBackward writes no y: *y_map stays as it is).
template <bool kTransposeW, Epilogue kEpilogue>
cudaError_t EncodeForwardMaps(const bf16* x, const bf16* w, const bf16* y, int groups, int64_t rows,
                              int64_t n, int64_t k, CUtensorMap* x_map, CUtensorMap* w_map,
                              CUtensorMap* y_map) {
  const uint64_t g = static_cast<uint64_t>(groups), ur = static_cast<uint64_t>(rows);
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k), uf = un / 2;
  cudaError_t status = EncodeTensorMap<2>(x_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, {uk, ur},
                                          {uk * 2}, {kBlockK, 64});
  if (status != cudaSuccess) return status;
  status = kTransposeW ? EncodeTensorMap<3>(w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, {uk, un, g},
                                            {uk * 2, un * uk * 2}, {kBlockK, kBlockN / 2, 1})
                       : EncodeTensorMap<3>(w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, {un, uk, g},
                                            {un * 2, un * uk * 2}, {64, kBlockK, 1});
  if (status != cudaSuccess) return status;
  constexpr uint32_t kColumns = kWriteColumns<bf16>;
  if constexpr (kEpilogue == Epilogue::kSwiglu) {
    status = EncodeTensorMap<3>(y_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, y, {uf, 2, ur},
                                {uf * 2, un * 2}, {kColumns, 1, 64});
  } else if constexpr (kEpilogue == Epilogue::kStore) {
    status = EncodeTensorMap<3>(y_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, y, {un, ur, 1},
                                {un * 2, un * 2 * ur}, {kColumns, 64, 1});
  }
  return status;
}

// The launch of GroupedMatmulSm90, GroupedMatmulSwigluSm90 (kSwiglu: y (rows, n = 2 f)) and
// GroupedMatmulSwigluBackwardSm90 (kSwigluBackward: y unused, n = f) on valid arguments with rows,
// n, k > 0.
template <bool kTransposeW, Epilogue kEpilogue>
cudaError_t LaunchGroupedMatmul(const bf16* x, const bf16* w, const int32_t* offsets, int groups,
                                int64_t rows, int64_t n, int64_t k, bf16* y,
                                const SwigluOperands& swiglu, const SplitWorkspace& split,
                                cudaStream_t stream) {
  CUtensorMap x_map, w_map, y_map = {};
  cudaError_t status = EncodeForwardMaps<kTransposeW, kEpilogue>(x, w, y, groups, rows, n, k,
                                                                 &x_map, &w_map, &y_map);
  if (status != cudaSuccess) return status;
  // Cluster tiles <= row tiles x column tiles; sum_g ceil(rows_g / kBlockM) <= (rows + groups
  // (kBlockM - 1)) / kBlockM. (With kSwiglu, ceil(f / (kBlockN / 2)) column tiles: as many.)
  const int64_t tiles = (rows + static_cast<int64_t>(groups) * (kBlockM - 1)) / kBlockM *
                        ((n + kBlockN - 1) / kBlockN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  return LaunchPersistent<&GroupedMatmulKernel<kTransposeW, kEpilogue>>(
      ForwardPipeline<kTransposeW, kEpilogue>::kSmemBytes, kForwardCluster, tiles, stream, x_map,
      w_map, y_map, offsets, groups, static_cast<int>(rows), static_cast<int>(n),
      static_cast<int>(k), y, swiglu, split);
}

// Checks the `count` parts of a weight gradient's rows (dy (rows, n), x (rows, k)) and encodes
// their tensor maps into *parts, leaving out parts without rows (all of them where n or k is 0);
// *rows: the rows of all parts. cudaErrorInvalidValue for a part of 2^31 rows or more or with
// operands not 16-byte aligned.
inline cudaError_t EncodeWeightGradParts(const WeightGradRows* rows_parts, int count, int64_t n,
                                         int64_t k, WeightGradParts* parts, int64_t* rows) {
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k);
  for (int i = 0; i < count; ++i) {
    const WeightGradRows& part = rows_parts[i];
    if (!FitsInt(part.rows) || !Aligned16(part.dy) || !Aligned16(part.x)) {
      return cudaErrorInvalidValue;
    }
    if (part.rows == 0 || n == 0 || k == 0) continue;  // nothing to add (its offsets are all 0)
    const int p = parts->count++;
    const uint64_t ur = static_cast<uint64_t>(part.rows);
    cudaError_t status = EncodeTensorMap<2>(&parts->dy[p], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                            part.dy, {un, ur}, {un * 2}, {64, kBlockK});
    if (status != cudaSuccess) return status;
    status = EncodeTensorMap<2>(&parts->x[p], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, part.x, {uk, ur},
                                {uk * 2}, {64, kBlockK});
    if (status != cudaSuccess) return status;
    parts->offsets[p] = part.offsets;
    parts->rows[p] = static_cast<int>(part.rows);
    *rows += part.rows;
  }
  return cudaSuccess;
}

// The launch of GroupedMatmulWeightGradSm90 on valid, encoded parts of `rows` rows in all, and
// rows, n, k > 0.
template <typename Out>
cudaError_t LaunchGroupedWeightGrad(const WeightGradParts& parts, int64_t rows, int groups,
                                    int64_t n, int64_t k, bool accumulate, Out* dw,
                                    cudaStream_t stream) {
  const WeightGradClusterSchedule schedule = WeightGradClusterSchedule::Of(n, k, rows, groups);
  const int64_t tiles = static_cast<int64_t>(groups) * schedule.m_pairs * schedule.n_tiles;
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  CUtensorMap dw_map;
  cudaError_t status = EncodeWeightGradOutputMap(&dw_map, dw, groups, n, k);
  if (status != cudaSuccess) return status;
  return LaunchPersistent<&GroupedWeightGradKernel<Out>>(kWeightGradSmemBytes, kWeightGradCluster,
                                                         tiles, stream, parts, dw_map, schedule,
                                                         groups, static_cast<int>(n), accumulate);
}

}  // namespace moe::cuda::sm90::detail
