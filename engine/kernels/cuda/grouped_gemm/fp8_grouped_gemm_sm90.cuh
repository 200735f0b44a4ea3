// The Hopper (sm_90a) FP8 grouped GEMMs: the MoE expert layers' products on e4m3 operands with
// DeepSeek-V3's blockwise scaling (engine/kernels/fp8_scaling.h, whose constexpr layout the
// kernels call: built, as the engine is, with --expt-relaxed-constexpr). Self-contained (CUDA
// headers and that one) so that tests/kernels/fp8_grouped_gemm_sm90_probe.cu builds it with one
// nvcc command; the engine's CUDA Fp8GroupedMatmul and Fp8GroupedMatmulWeightGrad reach it through
// fp8_grouped_matmul_sm90.cu (contracts: op_declarations.inc). The kernels lie in
// sm90/fp8_forward_kernel.cuh, sm90/fp8_weight_grad_kernel.cuh and
// sm90/fp8_weight_grad_cluster_kernel.cuh, what they share in sm90/fp8_mainloop.cuh and (the
// weight gradient's two) sm90/fp8_weight_grad_common.cuh, and they share the bf16 kernels' pieces
// (grouped_gemm_sm90.cuh's design note: the mbarrier stage protocol, TMA with the 128-byte swizzle,
// the K-major wgmma descriptors, the accumulator layout, the offsets' scan, the weight gradient's
// parts).
//
// Operations: group g owns the rows [offsets[g], offsets[g + 1]) (offsets (groups + 1) int32 in
// DEVICE memory; the kernels trap unless 0 = offsets[0] <= ... <= offsets[groups] = rows).
//   Fp8GroupedMatmulSm90: y[rows of g] (=) = xq[rows of g] · wq_g^T, xq (rows, k) e4m3, wq
//   (groups, n, k) e4m3 (both K-major), y (rows, n) f32 or bf16; x_scales (rows, ceil(k / 128))
//   f32, one per row and 128-wide K tile; w_scales (groups, ceil(n / 128), ceil(k / 128)) f32, one
//   per 128 x 128 block. Per output element, over the K tiles t in ascending order from acc = 0:
//   partial_t = the tile's e4m3 products summed by the tensor cores (wgmma, f32 accumulators fresh
//   per tile, so no reduced-precision sum runs longer than 128), acc = fma(partial_t, x_scale[row,
//   t] * w_scale[g, column / 128, t], acc); y = acc rounded to y's type (bf16: nearest even).
//   Every row of y is written (k == 0: zeros).
//   Requirements (the launcher returns cudaErrorInvalidValue otherwise): k a multiple of 16 and n
//   of 8, xq, wq and y 16-byte aligned (TMA, which y's writes use too: global strides and
//   addresses multiples of 16 bytes; the copied rows' 16-byte pieces); rows, n, k < 2^31;
//   1 <= groups <= kMaxGroups.
//   Fp8GroupedMatmulWeightGradSm90: dw_g (=) or (+=) the sum over up to kMaxWeightGradParts parts
//   p (Fp8WeightGradRows: QuantizeColumnTiles' forms of dy_p (rows_p, n) and x_p (rows_p, k), each
//   with its own offsets) of dy_p[rows of g]^T · x_p[rows of g]; dw (groups, n, k) f32 or bf16.
//   The operands are transposed, tokens contiguous: dy_q (n, stride_p), x_q (k, stride_p) e4m3,
//   stride_p = Fp8ColumnTokens(groups, rows_p) (a multiple of 32); group g's tokens in part p
//   start at token Fp8ColumnStart(g, offsets_p[g]) (a multiple of 32) and are followed by zeros up
//   to a multiple of 32; they are cut into tiles t of 128 from the group's first (fp8_scaling.h's
//   Fp8ColumnTileRows), whose scales are row Fp8ColumnTileSlot(g, offsets_p[g], t) of dy_scales
//   (slots_p, n) and x_scales (slots_p, k) f32. Per element (i, j) of dw_g, over the parts in order
//   and in each over g's tiles in order, from acc = 0: acc = fma(partial_t, dy_scale[slot, i] *
//   x_scale[slot, j], acc), partial_t the tile's products summed by the tensor cores (fresh
//   accumulators per tile); then dw = acc rounded (=), or dw += acc (a TMA reduce-add: an f32 dw
//   gets round(dw + acc), one rounding; a bf16 dw gets acc already rounded to bf16 added, two
//   roundings; one add per element, so run-to-run identical). A group without tokens in any part:
//   zeros (=) or unchanged (+=). Requirements (cudaErrorInvalidValue otherwise): n and k multiples
//   of 16 (the scale rows' bulk copies take 16-byte pieces), every operand and dw 16-byte aligned,
//   rows_p, n, k < 2^31, 1 <= groups <= kMaxGroups, 1 <= parts <= kMaxWeightGradParts.
//
// Design (one CTA per SM, persistent; the forward in clusters of two CTAs, the weight gradient
// with or without; tiles round-robin over the clusters or CTAs; CTA = 3 warpgroups: warpgroup 0
// produces, warpgroups 1 and 2 consume, 64 output rows each):
//   - A stage holds one 128-deep K tile of both operands, 128 rows of A and 192 (forward,
//     clustered weight gradient) or 128 of B, 128 e4m3 a row (one 128-byte swizzle row: 40 or 32
//     KiB; kFp8ForwardStages = 5 and kFp8WeightGradStages = 5 of them, beside the output staging).
//     Per stage a consumer issues (up to) 4 m64n192k32 or m64n128k32 wgmmas into fresh
//     accumulators, waits for them, releases the stage and promotes them into its f32 accumulators
//     with one fma each (96 + 96 or 64 + 64 registers a thread); while one consumer promotes, the
//     other's wgmmas run.
//   - Epilogue: each consumer stages its 64 x 192 or 64 x 128 result through shared memory
//     (epilogue.cuh's WriteTile, which the bf16 kernels use too: the forward and the clustered
//     weight gradient one TMA box, the unclustered two) and stores (or, the weight gradient's dw
//     +=, reduce-adds) it with TMA, which clips it to the tensor; the stores drain while the
//     consumer multiplies its next tile. The forward's consumer whose 64 rows cross its group's end
//     copies its valid rows from the staging instead (WriteRows). With a few hundred tokens per
//     expert, writing dw is most of the weight gradient's work.
//   - Forward tiles: 128 x 192 of y, two to a cluster tile (grouped_gemm_tiles.h's schedule, as
//     the bf16 forward's with 192-column tiles: a group's row pairs, which share w's tile, then
//     for an odd last row tile column pairs, which share x's rows): each CTA loads its own
//     operand and its part of the shared one (of w's three 64-row boxes, rank 0 two and rank 1
//     one; half of x's rows), multicast to both, so a row pair's stage costs L2 28 KiB a CTA
//     instead of 40: 22% fewer bytes a product than 128 x 128 tiles' 24 KiB (whose kernel ran L2
//     at 89% of its peak). A tile's 192 columns start 0 or 64 columns into a 128-column weight
//     scale block, so they take two blocks' scales, split at tile column 128 or 64. A row tile
//     never crosses its group's end: rows past it are loaded (the next group's, or TMA's zero fill
//     past `rows`) but never stored; n and k tails are zero-filled by TMA (w is a 3-D map with the
//     group outermost, so no read crosses into the next expert), and zeros add nothing. The scales
//     of a stage are loaded from global memory before it is waited for (one per row and one per
//     tile).
//   - Weight-gradient tiles, by the average group's token tiles (Fp8WeightGradUsesClusters):
//     up to 8, 128 dw rows (of n) x 128 dw columns (of k) of one group, a CTA alone,
//     groups x ceil(n / 128) x ceil(k / 128) of them (FindFp8WeightGradTile: group-major, so the
//     CTAs resident together read one group's operands from L2), each consumer staging its whole
//     bf16 result at once (with few token tiles a tile's writes count); beyond, 128 x 192, two to
//     a cluster tile stacked along dw's rows (grouped_gemm_tiles.h's WeightGradClusterScheduleOf,
//     group-major, in bands of row pairs where a group's dy outgrows L2), which share x's 192
//     columns: rank 0 loads two of its three 64-row boxes and rank 1 one, multicast to both, so a
//     stage costs L2 28 KiB a CTA for 1.5 times a 128 x 128 tile's products (32 KiB), and the
//     operands' traffic, which bounds the kernel with many token tiles, falls. K: the group's
//     token tiles in each part in turn (ForEachTokenTile; the unclustered kernel's producer and
//     consumers walk it alike, the clustered kernel's producer writes each stage's K slices and
//     whether it is its tile's last beside the stage, and its consumers read them there: one flat
//     loop, as ptxas needs beside 96 + 96 f32). Each element needs its own scale (its row's dy
//     scale times its column's x scale): the producer bulk-copies the token tile's 128 dy and 128
//     or 192 x scales (cp.async.bulk, on the stage's full barrier, counted in its bytes) beside
//     the stage, and a consumer reads its 2 rows' and 32 or 48 columns' scales from there before
//     it releases the stage (PromoteFp8WeightGradStage). TMA loads 128 tokens from a token
//     tile's first (a multiple of 32 in the transposed rows, as TMA needs its boxes' first bytes
//     16-byte aligned), and the consumers multiply only the 32-token K slices that hold the tile's
//     tokens (Fp8TokenTile): a group's last slice is completed by the zeros the quantiser writes
//     after the group, so no token of another group enters a product.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_forward_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_weight_grad_cluster_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_weight_grad_kernel.cuh"
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
  CUtensorMap x_map, w_map, y_map;
  cudaError_t status = EncodeTensorMap<2>(&x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, xq, {uk, ur}, {uk},
                                          {kFp8BlockK, kFp8BoxRows});
  if (status != cudaSuccess) return status;
  status = EncodeTensorMap<3>(&w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, wq, {uk, un, g}, {uk, un * uk},
                              {kFp8BlockK, kFp8BoxRows, 1});
  if (status != cudaSuccess) return status;
  constexpr uint64_t kOutBytes = sizeof(Out);
  status = EncodeTensorMap<3>(&y_map,
                              std::is_same_v<Out, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                              y, {un, ur, 1}, {un * kOutBytes, un * ur * kOutBytes},
                              {kWriteColumns<Out>, 64, 1});
  if (status != cudaSuccess) return status;
  // Tiles <= sum_g ceil(rows_g / kFp8BlockM) column tiles; cluster tiles fewer.
  const int64_t tiles = (rows + static_cast<int64_t>(groups) * (kFp8BlockM - 1)) / kFp8BlockM *
                        ((n + kFp8ForwardTileN - 1) / kFp8ForwardTileN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  return LaunchPersistent<&Fp8GroupedMatmulKernel<Out>>(
      kFp8SmemBytes, kFp8ForwardCluster, tiles, stream, x_map, w_map, y_map, x_scales, w_scales,
      offsets, groups, static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k), y);
}

// See the file comment: dw_g (+)= the sum over the `count` parts (count <= kMaxWeightGradParts)
// of dy_p,g^T · x_p,g in one launch; dw (groups, n, k), Out float or bf16. Asynchronous on
// `stream`; returns the first error of argument checks, tensor-map encoding or the launch.
template <typename Out>
cudaError_t Fp8GroupedMatmulWeightGradSm90(const Fp8WeightGradRows* rows_parts, int count,
                                           int groups, int64_t n, int64_t k, bool accumulate,
                                           Out* dw, cudaStream_t stream) {
  using namespace detail;
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>, "dw is f32 or bf16");
  if (groups < 1 || groups > kMaxGroups || count < 1 || count > kMaxWeightGradParts ||
      !FitsInt(n) || !FitsInt(k) || n % 16 != 0 || k % 16 != 0 || !Aligned16(dw)) {
    return cudaErrorInvalidValue;
  }
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k);
  int64_t rows = 0;  // of all parts
  for (int i = 0; i < count; ++i) {
    const Fp8WeightGradRows& part = rows_parts[i];
    if (!FitsInt(part.rows) || !FitsInt(part.stride) || part.stride < part.rows ||
        part.stride % 16 != 0 || part.offsets == nullptr || !Aligned16(part.dy_q) ||
        !Aligned16(part.x_q) || !Aligned16(part.dy_scales) || !Aligned16(part.x_scales)) {
      return cudaErrorInvalidValue;
    }
    rows += part.rows;
  }
  if (n == 0 || k == 0) return cudaSuccess;
  if (rows == 0) {
    return accumulate
               ? cudaSuccess
               : cudaMemsetAsync(dw, 0, static_cast<size_t>(groups * n * k) * sizeof(Out), stream);
  }
  // The parts with rows (the others add nothing: their offsets are all 0), their maps' x boxes
  // as the chosen kernel loads them.
  const bool clustered = Fp8WeightGradUsesClusters(rows, groups);
  const uint32_t x_box_rows = static_cast<uint32_t>(Fp8WeightGradXBoxRows(clustered));
  Fp8WeightGradParts parts = {};
  for (int i = 0; i < count; ++i) {
    const Fp8WeightGradRows& part = rows_parts[i];
    if (part.rows == 0) continue;
    const int p = parts.tokens.count++;
    const uint64_t stride = static_cast<uint64_t>(part.stride);
    cudaError_t status =
        EncodeTensorMap<2>(&parts.tokens.dy[p], CU_TENSOR_MAP_DATA_TYPE_UINT8, part.dy_q,
                           {stride, un}, {stride}, {kFp8BlockK, kFp8BlockM});
    if (status != cudaSuccess) return status;
    status = EncodeTensorMap<2>(&parts.tokens.x[p], CU_TENSOR_MAP_DATA_TYPE_UINT8, part.x_q,
                                {stride, uk}, {stride}, {kFp8BlockK, x_box_rows});
    if (status != cudaSuccess) return status;
    parts.tokens.offsets[p] = part.offsets;
    parts.tokens.rows[p] = static_cast<int>(part.rows);
    parts.dy_scales[p] = part.dy_scales;
    parts.x_scales[p] = part.x_scales;
  }
  CUtensorMap dw_map;
  const cudaError_t status = EncodeWeightGradOutputMap(&dw_map, dw, groups, n, k);
  if (status != cudaSuccess) return status;
  if (clustered) {  // pairs of 128 x 192 tiles in clusters of two
    const Fp8ClusterWeightGradSchedule schedule =
        Fp8ClusterWeightGradSchedule::Of(n, k, rows, groups);
    const int64_t tiles = static_cast<int64_t>(groups) * schedule.m_pairs * schedule.n_tiles;
    if (!FitsInt(tiles)) return cudaErrorInvalidValue;
    return LaunchPersistent<&Fp8GroupedWeightGradClusterKernel<Out>>(
        kFp8ClusterWeightGradSmemBytes, kFp8WeightGradCluster, tiles, stream, parts, dw_map,
        schedule, groups, static_cast<int>(n), static_cast<int>(k), accumulate);
  }
  // 128 x 128 tiles, a CTA alone.
  const int64_t tiles =
      groups * ((n + kFp8BlockM - 1) / kFp8BlockM) * ((k + kFp8BlockN - 1) / kFp8BlockN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  return LaunchPersistent<&Fp8GroupedWeightGradKernel<Out>>(
      kFp8WeightGradSmemBytes, 1, tiles, stream, parts, dw_map, groups, static_cast<int>(n),
      static_cast<int>(k), accumulate);
}

}  // namespace moe::cuda::sm90
