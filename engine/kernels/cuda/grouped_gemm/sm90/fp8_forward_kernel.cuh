// The Hopper FP8 grouped GEMM's forward kernel (design: ../fp8_grouped_gemm_sm90.cuh): y (=) = xq ·
// wq_g^T per group on e4m3 operands, both K-major, with DeepSeek-V3's blockwise scales applied
// once per 128-wide K tile into f32 accumulators. A persistent launch of warp-specialised CTAs (no
// cluster): warpgroup 0's thread 0 TMA-loads each K tile's operands into a ring of stages
// (ProduceFp8Stages), warpgroups 1 and 2 each multiply 64 rows of the 128 x 128 tile and promote
// the tile's partial sums (ConsumeFp8Tiles), then store their rows of y from registers. The ring
// and a stage's multiplication are fp8_mainloop.cuh's, shared with the weight gradient.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/tile_scheduler.cuh"

namespace moe::cuda::sm90 {

// The offsets and the tile prefix (kMaxGroups + 1 ints each), after the stage ring.
constexpr int kFp8SmemBytes = kFp8RingBytes + 2 * (kMaxGroups + 1) * 4;
static_assert(kFp8SmemBytes <= 227 * 1024);

namespace detail {

// A tile of y: rows [row0, min(row0 + kFp8BlockM, row_end)) of `group` (row_end: the group's
// end), columns [n0, n0 + kFp8BlockN).
struct Fp8Tile {
  int group, row0, row_end, n0;
};

// Tile t: group-major; within a group column-tile-major, so that the CTAs resident together
// read one weight tile (from L2) for consecutive row tiles. tile_prefix: BuildTileSchedule's,
// ceil(rows_g / kFp8BlockM) n_tiles tiles per group.
__device__ __forceinline__ Fp8Tile FindFp8Tile(const int* offsets, const int* tile_prefix,
                                               int groups, int t) {
  const int g = GroupOfTile(tile_prefix, groups, t);
  const int begin = offsets[g], end = offsets[g + 1];
  const int row_tiles = (end - begin + kFp8BlockM - 1) / kFp8BlockM;
  const int local = t - tile_prefix[g];
  return {g, begin + local % row_tiles * kFp8BlockM, end, local / row_tiles * kFp8BlockN};
}

// FindFp8Tile in registers the compiler knows to be warp-uniform (see WarpUniform): for the
// consumers, whose wgmmas it steers (the producer, one thread, must not shuffle).
__device__ __forceinline__ Fp8Tile UniformFp8Tile(const Fp8Tile& tile) {
  return {WarpUniform(tile.group), WarpUniform(tile.row0), WarpUniform(tile.row_end),
          WarpUniform(tile.n0)};
}

// The forward's bytes after the stage ring (Fp8Ring::Extra): the offsets, then the tile prefix.
__device__ __forceinline__ int* Fp8Offsets(const Fp8Ring& ring) {
  return reinterpret_cast<int*>(ring.Extra());
}
__device__ __forceinline__ int* Fp8TilePrefix(const Fp8Ring& ring) {
  return Fp8Offsets(ring) + kMaxGroups + 1;
}

// out[index], out[index + 1] = a, b rounded to Out (bf16: nearest even).
template <typename Out>
__device__ __forceinline__ void WriteOutputPair(Out* out, int64_t index, float a, float b) {
  if constexpr (std::is_same_v<Out, float>) {
    *reinterpret_cast<float2*>(out + index) = make_float2(a, b);
  } else {
    static_assert(std::is_same_v<Out, __nv_bfloat16>, "the output is f32 or bf16");
    *reinterpret_cast<__nv_bfloat162*>(out + index) = __floats2bfloat162_rn(a, b);
  }
}

// The producer (thread 0 of warpgroup 0): for each of this CTA's tiles and each K tile, waits
// until the next stage is empty and loads x's 128 rows and w's 128 rows of the tile's K tile into
// it. Rows past the tensors and K past k are zero-filled (they count toward the stage's bytes).
__device__ __forceinline__ void ProduceFp8Stages(const CUtensorMap& x_map, const CUtensorMap& w_map,
                                                 const Fp8Ring& ring, const int* offsets,
                                                 const int* tile_prefix, int groups, int total,
                                                 int k_tiles) {
  PrefetchTensorMap(x_map);
  PrefetchTensorMap(w_map);
  const auto barriers = ring.Barriers();
  PipelineState<kFp8Stages> state;
  for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
    const Fp8Tile tile = FindFp8Tile(offsets, tile_prefix, groups, t);
    for (int kt = 0; kt < k_tiles; ++kt) {
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      const uint32_t full = barriers.Full(state.stage);
      MbarrierArriveExpectTx(full, kFp8StageBytes);
      TmaLoad2d(x_map, ring.A(state.stage), full, kt * kFp8BlockK, tile.row0, L2EvictNormal());
      TmaLoad3d(w_map, ring.B(state.stage), full, kt * kFp8BlockK, tile.n0, tile.group,
                L2EvictLast());
      state.Advance();
    }
  }
}

// Consumer warpgroup `consumer` (0 or 1): for each of this CTA's tiles, its 64 rows from
// first_row (none when they all lie past the group's end: it only releases the stages). Per K
// tile kt: part = the tile's e4m3 products (4 wgmmas, fresh), then acc = fma(part, x_scale[row,
// kt] * w_scale[group, block, kt], acc) for its rows Row() and Row() + 8 (FragmentPosition);
// the scales are loaded before the stage is waited for. Then its valid rows and columns of y =
// acc (plain stores of column pairs).
template <typename Out>
__device__ __forceinline__ void ConsumeFp8Tiles(const Fp8Ring& ring, const float* x_scales,
                                                const float* w_scales, const int* offsets,
                                                const int* tile_prefix, int groups, int total,
                                                int n, int k_tiles, int consumer, Out* y) {
  const FragmentPosition at;
  const int n_blocks = (n + kFp8BlockN - 1) / kFp8BlockN;
  float acc[kFp8Accumulators], part[kFp8Accumulators];
#pragma unroll
  for (int i = 0; i < kFp8Accumulators; ++i) part[i] = 0.0f;  // each tile's first wgmma drops it
  PipelineState<kFp8Stages> state;
  for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
    const Fp8Tile tile = UniformFp8Tile(FindFp8Tile(offsets, tile_prefix, groups, t));
    const int first_row = tile.row0 + 64 * consumer;
    const bool active = first_row < tile.row_end;  // warp-uniform
    const int row0 = first_row + at.Row(), row1 = row0 + 8;
    // Rows past the group's end get scale 0 (their results are not stored).
    const float* const xs0 = row0 < tile.row_end ? x_scales + int64_t{row0} * k_tiles : nullptr;
    const float* const xs1 = row1 < tile.row_end ? x_scales + int64_t{row1} * k_tiles : nullptr;
    const float* const ws =
        w_scales + (int64_t{tile.group} * n_blocks + tile.n0 / kFp8BlockN) * k_tiles;
#pragma unroll
    for (int i = 0; i < kFp8Accumulators; ++i) acc[i] = 0.0f;
    const uint32_t a_offset = consumer * (kFp8OperandBytes / 2);  // its 64 rows of A
    for (int kt = 0; kt < k_tiles; ++kt) {
      float scale0 = 0.0f, scale1 = 0.0f;
      if (active) {
        const float w_scale = ws[kt];
        if (xs0 != nullptr) scale0 = xs0[kt] * w_scale;
        if (xs1 != nullptr) scale1 = xs1[kt] * w_scale;
      }
      MultiplyFp8Stage(part, ring, state, a_offset, active, 0, kFp8StageSlices, [](int) {});
      if (active) {
        // Register 4 i + 2 h + j holds row Row() + 8 h.
#pragma unroll
        for (int i = 0; i < kFp8Accumulators; ++i) {
          acc[i] = fmaf(part[i], i % 4 < 2 ? scale0 : scale1, acc[i]);
        }
      }
    }
    if (!active) continue;
#pragma unroll
    for (int i = 0; i < kFp8Accumulators / 4; ++i) {
      const int column = tile.n0 + 8 * i + at.Column();
      if (column >= n) continue;  // n % 8 == 0: column + 1 < n too
      if (row0 < tile.row_end) {
        WriteOutputPair(y, int64_t{row0} * n + column, acc[4 * i], acc[4 * i + 1]);
      }
      if (row1 < tile.row_end) {
        WriteOutputPair(y, int64_t{row1} * n + column, acc[4 * i + 2], acc[4 * i + 3]);
      }
    }
  }
}

// y = xq · wq_g^T per group with the blockwise scales (see ../fp8_grouped_gemm_sm90.cuh).
// x_map: xq as (k, rows) uint8, box (128, 128); w_map: wq as (k, n, groups), box (128, 128, 1);
// x_scales (rows, ceil(k / 128)), w_scales (groups, ceil(n / 128), ceil(k / 128)) f32; y (rows,
// n). kThreads threads, kFp8SmemBytes of dynamic shared memory, any grid (persistent: CTA b
// takes tiles b, b + gridDim.x, ...).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GroupedMatmulKernel(const __grid_constant__ CUtensorMap x_map,
                           const __grid_constant__ CUtensorMap w_map, const float* x_scales,
                           const float* w_scales, const int32_t* device_offsets, int groups,
                           int rows, int n, int k, Out* y) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const Fp8Ring ring(smem_raw);
  if (threadIdx.x == 0) ring.Barriers().Init();
  const int n_tiles = (n + kFp8BlockN - 1) / kFp8BlockN;
  int* const offsets = Fp8Offsets(ring);
  int* const tile_prefix = Fp8TilePrefix(ring);
  // Its __syncthreads also publish the barriers' initialisation.
  BuildTileSchedule(
      device_offsets, groups, rows,
      [n_tiles](int group_rows) { return (group_rows + kFp8BlockM - 1) / kFp8BlockM * n_tiles; },
      offsets, tile_prefix);
  const int total = WarpUniform(tile_prefix[groups]);
  const int k_tiles = (k + kFp8BlockK - 1) / kFp8BlockK;
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x == 0) {
      ProduceFp8Stages(x_map, w_map, ring, offsets, tile_prefix, groups, total, k_tiles);
    }
  } else {
    IncreaseMaxRegisters<kConsumerRegisters>();
    ConsumeFp8Tiles<Out>(ring, x_scales, w_scales, offsets, tile_prefix, groups, total, n, k_tiles,
                         warpgroup - 1, y);
  }
#else
  __trap();
#endif
}

}  // namespace detail

}  // namespace moe::cuda::sm90
