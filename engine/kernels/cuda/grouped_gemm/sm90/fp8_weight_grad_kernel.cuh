// The Hopper FP8 grouped weight gradient's unclustered kernel, for few token tiles a group
// (fp8_weight_grad_common.cuh; design: ../fp8_grouped_gemm_sm90.cuh): dw_g
// (+)= the sum over parts of dy_p,g^T · x_p,g on QuantizeColumnTiles' forms (tokens contiguous,
// so both operands are K-major, as FP8 wgmma needs), scaled per token tile (up to 128 of a group's
// tokens), dw row and dw column, with the promotion once per token tile. A persistent launch of
// warp-specialised CTAs (no cluster): warpgroup 0's thread 0 TMA-loads each token tile of both
// operands and bulk-copies its scales into a ring of stages (ProduceFp8WeightGradStages), and
// warpgroups 1 and 2 each multiply 64 dw rows of the 128 x 128 tile over the tile's 32-token K
// slices, promote, and write or add (TMA store or reduce-add, staged through shared memory:
// epilogue.cuh's WriteTile) their rows of dw (ConsumeFp8WeightGradTiles).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_weight_grad_common.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"

namespace moe::cuda::sm90 {

constexpr int kFp8ScaleFloats = kFp8BlockM + kFp8BlockN;  // a stage's dy and x scales
// A consumer's output staging: two boxes, its whole bf16 result (one round) or half of f32's.
constexpr int kFp8WeightGradStagingBytes = 2 * kBoxBytes;

namespace detail {
using Fp8WeightGradRing = Fp8Ring<kFp8WeightGradStages>;
constexpr int kFp8WeightGradAccumulators = Fp8WeightGradRing::kAccumulators;  // f32 a thread
}  // namespace detail

// The kernel's bytes after the ring: each consumer's output staging (1024-byte aligned, as the
// 128-byte swizzle of its TMA boxes needs), then each stage's scales; with the ring's base's
// alignment slack (1023).
constexpr int kFp8StagingOffset = (detail::Fp8WeightGradRing::kExtraOffset + 1023) / 1024 * 1024;
constexpr int kFp8ScalesOffset = kFp8StagingOffset + kConsumers * kFp8WeightGradStagingBytes;
constexpr int kFp8WeightGradSmemBytes =
    1023 + kFp8ScalesOffset + kFp8WeightGradStages * kFp8ScaleFloats * 4;
static_assert(kFp8WeightGradSmemBytes <= 227 * 1024);

namespace detail {

// A tile of dw: group `group`'s rows [m0, m0 + kFp8BlockM) (of n) and columns [n0, n0 +
// kFp8BlockN) (of k).
struct Fp8WeightGradTile {
  int group, m0, n0;
};

// Tile t: group-major, then row tiles, then column tiles (m_tiles x n_tiles per group).
__device__ __forceinline__ Fp8WeightGradTile FindFp8WeightGradTile(int t, int m_tiles,
                                                                   int n_tiles) {
  const int local = t % (m_tiles * n_tiles);
  return {t / (m_tiles * n_tiles), local / n_tiles * kFp8BlockM, local % n_tiles * kFp8BlockN};
}

// A stage's scales: kFp8BlockM of dy (the tile's dw rows), then kFp8BlockN of x (its columns).
__device__ __forceinline__ float* Fp8StageScales(const Fp8WeightGradRing& ring, int stage) {
  return reinterpret_cast<float*>(ring.base + kFp8ScalesOffset) + stage * kFp8ScaleFloats;
}

// The producer (thread 0 of warpgroup 0): for each of this CTA's tiles and each of its group's
// token tiles, waits until the next stage is empty and loads into it dy_q's 128 rows and x_q's 128
// rows of the tile over 128 tokens from the token tile's first (TMA; rows past n or k and tokens
// past the stride are zero-filled and count toward the bytes) and their scales (bulk copies of
// the valid rows' and columns' floats), all landing on full[s].
__device__ __forceinline__ void ProduceFp8WeightGradStages(const Fp8WeightGradParts& parts,
                                                           const Fp8WeightGradRing& ring, int total,
                                                           int m_tiles, int n_tiles, int n, int k) {
  for (int p = 0; p < parts.tokens.count; ++p) {
    PrefetchTensorMap(parts.tokens.dy[p]);
    PrefetchTensorMap(parts.tokens.x[p]);
  }
  const auto barriers = ring.Barriers<1>();
  PipelineState<kFp8WeightGradStages> state;
  for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
    const Fp8WeightGradTile tile = FindFp8WeightGradTile(t, m_tiles, n_tiles);
    // n, k multiples of 4: whole 16-byte chunks.
    const uint32_t dy_bytes = min(kFp8BlockM, n - tile.m0) * 4;
    const uint32_t x_bytes = min(kFp8BlockN, k - tile.n0) * 4;
    ForEachTokenTile(parts, tile.group, [&](const Fp8TokenTile& token_tile) {
      const int p = token_tile.part;
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      const uint32_t full = barriers.Full(state.stage);
      MbarrierArriveExpectTx(full, Fp8WeightGradRing::kStageBytes + dy_bytes + x_bytes);
      TmaLoad2d(parts.tokens.dy[p], ring.A(state.stage), full, token_tile.first, tile.m0,
                L2EvictLast());
      TmaLoad2d(parts.tokens.x[p], ring.B(state.stage), full, token_tile.first, tile.n0,
                L2EvictLast());
      const uint32_t scales = SmemAddress(Fp8StageScales(ring, state.stage));
      const int64_t slot = token_tile.slot;
      BulkLoad(scales, parts.dy_scales[p] + slot * n + tile.m0, dy_bytes, full);
      BulkLoad(scales + kFp8BlockM * 4, parts.x_scales[p] + slot * k + tile.n0, x_bytes, full);
      state.Advance();
    });
  }
}

// Consumer warpgroup `consumer` (0 or 1): for each of this CTA's tiles, its 64 dw rows from m0 +
// 64 consumer (none when they all lie past n: it only releases the stages). Per stage: part = the
// token tile's e4m3 products over its 32-token slices (Fp8TokenTile: up to 4 wgmmas, fresh), then
// acc = fma(part, dy_scale[row] * x_scale[column], acc) for its rows Row() and Row() + 8 and its 32
// columns (FragmentPosition), with the scales read from the stage before it is released. Then its
// rows of dw_g = acc, or += acc with `accumulate` (TMA store or reduce-add of the rows and columns
// inside dw, through its staging; waits for them before it returns); a group without tokens in any
// part is skipped with `accumulate` and written as zeros without.
template <typename Out>
__device__ __forceinline__ void ConsumeFp8WeightGradTiles(const Fp8WeightGradParts& parts,
                                                          const CUtensorMap& dw_map,
                                                          const Fp8WeightGradRing& ring, int total,
                                                          int m_tiles, int n_tiles, int n,
                                                          int consumer, bool accumulate) {
  const FragmentPosition at;
  const int row = 64 * consumer + at.Row();  // in the tile; and row + 8
  const uint32_t staging =
      SmemAddress(ring.base + kFp8StagingOffset + consumer * kFp8WeightGradStagingBytes);
  float acc[kFp8WeightGradAccumulators], part[kFp8WeightGradAccumulators];
  // Zeros only to define them: each tile's first wgmma drops them.
#pragma unroll
  for (int i = 0; i < kFp8WeightGradAccumulators; ++i) part[i] = 0.0f;
  PipelineState<kFp8WeightGradStages> state;
  for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
    const Fp8WeightGradTile found = FindFp8WeightGradTile(t, m_tiles, n_tiles);
    const Fp8WeightGradTile tile = {WarpUniform(found.group), WarpUniform(found.m0),
                                    WarpUniform(found.n0)};
    const bool active = tile.m0 + 64 * consumer < n;  // warp-uniform
#pragma unroll
    for (int i = 0; i < kFp8WeightGradAccumulators; ++i) acc[i] = 0.0f;
    const uint32_t a_offset = consumer * kFp8BoxBytes;  // its 64 rows of A
    bool any_tokens = false;
    ForEachTokenTile(parts, tile.group, [&](const Fp8TokenTile& token_tile) {
      any_tokens = true;
      const int slices = WarpUniform(token_tile.Slices());
      MultiplyFp8Stage<1>(
          part, ring, state, a_offset, [&](int) { return active ? slices : 0; },
          [&](int stage) {
            if (active) PromoteFp8WeightGradStage(acc, part, Fp8StageScales(ring, stage), row, at);
          });
    });
    // No tokens: dw_g stays as it is (+=), or gets acc's zeros (=).
    if (!active || (!WarpUniform(any_tokens) && accumulate)) continue;
    WriteTile<Out, kFp8WeightGradStagingBytes>(
        acc, dw_map, staging, 1 + consumer, accumulate, [&](int c) {
          return BoxOrigin{tile.n0 + c, tile.m0 + 64 * consumer, tile.group};
        });
  }
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
}

// dw_g (+)= sum over the parts of dy_p,g^T · x_p,g with the tile scales (see
// ../fp8_grouped_gemm_sm90.cuh); dw_map: dw (groups, n, k) of Out (EncodeWeightGradOutputMap).
// kThreads threads, kFp8WeightGradSmemBytes of dynamic shared memory, any grid (persistent: CTA b
// takes tiles b, b + gridDim.x, ...).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GroupedWeightGradKernel(const __grid_constant__ Fp8WeightGradParts parts,
                               const __grid_constant__ CUtensorMap dw_map, int groups, int n, int k,
                               bool accumulate) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const Fp8WeightGradRing ring(smem_raw);
  if (threadIdx.x == 0) ring.Barriers<1>().Init();
  __syncthreads();  // publishes the barriers' initialisation
  const int m_tiles = (n + kFp8BlockM - 1) / kFp8BlockM;
  const int n_tiles = (k + kFp8BlockN - 1) / kFp8BlockN;
  const int total = groups * m_tiles * n_tiles;
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x == 0) ProduceFp8WeightGradStages(parts, ring, total, m_tiles, n_tiles, n, k);
  } else {
    IncreaseMaxRegisters<kConsumerRegisters>();
    ConsumeFp8WeightGradTiles<Out>(parts, dw_map, ring, total, m_tiles, n_tiles, n, warpgroup - 1,
                                   accumulate);
  }
#else
  __trap();
#endif
}

}  // namespace detail

}  // namespace moe::cuda::sm90
