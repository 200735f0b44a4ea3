// The Hopper FP8 grouped weight gradient's clustered kernel, for many token tiles a group
// (fp8_weight_grad_common.cuh; design: ../fp8_grouped_gemm_sm90.cuh): dw_g
// (+)= the sum over parts of dy_p,g^T · x_p,g on QuantizeColumnTiles' forms (tokens contiguous,
// so both operands are K-major, as FP8 wgmma needs), scaled per token tile (up to 128 of a group's
// tokens), dw row and dw column, with the promotion once per token tile. A persistent launch of
// warp-specialised CTAs in clusters of two, each cluster tile a pair of 128 x 192 dw tiles stacked
// along dw's rows, which share x's 192 columns (grouped_gemm_tiles.h's
// WeightGradClusterScheduleOf): warpgroup 0's thread 0 TMA-loads each token tile of its CTA's dy
// rows and its part of the shared x columns, which it multicasts to both CTAs, and bulk-copies the
// tile's scales into a ring of stages (ProduceFp8ClusterWeightGradStages); warpgroups 1 and 2 each
// multiply 64 dw rows of the tile over the token tile's 32-token K slices, promote, and write or
// add (TMA store or reduce-add, staged through shared memory: epilogue.cuh's WriteTile) their rows
// of dw (ConsumeFp8ClusterWeightGradTiles).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_weight_grad_common.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/tile_scheduler.cuh"

namespace moe::cuda::sm90 {

constexpr int kFp8WeightGradCluster = 2;  // CTAs sharing (multicasting) x's columns
// A stage's dy and x scales.
constexpr int kFp8ClusterScaleFloats = kFp8BlockM + kFp8WeightGradTileN;
// What the consumers learn of a stage besides its operands and scales: the K slices that hold its
// token tile's tokens (0: the stage of a group without tokens, which holds no operands), and
// whether it is its dw tile's last.
struct Fp8StageInfo {
  int slices, last;
};
// A stage's bytes beside its operands: its scales, then its Fp8StageInfo (16 bytes, so that the
// next stage's scales stay 16-byte aligned for their bulk copies).
constexpr int kFp8ClusterStageInfoBytes = kFp8ClusterScaleFloats * 4 + 16;
static_assert(sizeof(Fp8StageInfo) <= 16);
// A consumer's output staging: one box, 3 bf16 rounds or 6 f32 (with the whole bf16 result in
// three, the epilogue's store addresses spilled beside the products).
constexpr int kFp8ClusterStagingBytes = kBoxBytes;
// The register split (config.cuh's, with 16 more a producer thread: at 40 its multicasts, scale
// copies and stage bookkeeping spilled; the consumers' 224 hold their 96 + 96 f32 without).
constexpr int kFp8ClusterProducerRegisters = 56;
constexpr int kFp8ClusterConsumerRegisters = 224;
static_assert(kFp8ClusterProducerRegisters * kWarpgroupThreads +
                  kFp8ClusterConsumerRegisters * kWarpgroupThreads * kConsumers <=
              kLaunchRegisters * kThreads);

namespace detail {
using Fp8ClusterWeightGradRing = Fp8Ring<kFp8WeightGradStages, kFp8WeightGradTileN>;
constexpr int kFp8ClusterAccumulators = Fp8ClusterWeightGradRing::kAccumulators;  // f32 a thread
using Fp8ClusterWeightGradSchedule = WeightGradClusterScheduleOf<kFp8WeightGradTileN, 1>;
}  // namespace detail

// The kernel's bytes after the ring: each consumer's output staging (1024-byte aligned, as the
// 128-byte swizzle of its TMA boxes needs), then each stage's scales; with the ring's base's
// alignment slack (1023).
constexpr int kFp8ClusterStagingOffset =
    (detail::Fp8ClusterWeightGradRing::kExtraOffset + 1023) / 1024 * 1024;
constexpr int kFp8ClusterScalesOffset =
    kFp8ClusterStagingOffset + kConsumers * kFp8ClusterStagingBytes;
constexpr int kFp8ClusterWeightGradSmemBytes =
    1023 + kFp8ClusterScalesOffset + kFp8WeightGradStages * kFp8ClusterStageInfoBytes;
static_assert(kFp8ClusterWeightGradSmemBytes <= 227 * 1024);

namespace detail {

// A stage's scales: kFp8BlockM of dy (the CTA's dw rows), then kFp8WeightGradTileN of x (the
// tile's columns); then its Fp8StageInfo.
__device__ __forceinline__ float* Fp8ClusterStageScales(const Fp8ClusterWeightGradRing& ring,
                                                        int stage) {
  return reinterpret_cast<float*>(ring.base + kFp8ClusterScalesOffset +
                                  stage * kFp8ClusterStageInfoBytes);
}
__device__ __forceinline__ Fp8StageInfo* Fp8StageInfoOf(const Fp8ClusterWeightGradRing& ring,
                                                        int stage) {
  return reinterpret_cast<Fp8StageInfo*>(Fp8ClusterStageScales(ring, stage) +
                                         kFp8ClusterScaleFloats);
}

// The producer (thread 0 of warpgroup 0): for each of its cluster's tiles and each of its group's
// token tiles, waits until the next stage is empty (in both CTAs: their consumers release it in
// each) and loads into it, over 128 tokens from the token tile's first, dy_q's 128 rows of its
// CTA's tile and the shared x_q's 192 rows as three 64-row boxes, rank 0 boxes 0 and 2 and rank 1
// box 1, each multicast to both CTAs (TMA; rows past n or k and tokens past the stride are
// zero-filled and count toward the bytes), and bulk-copies its CTA's scales of the token tile (its
// valid dw rows' dy scales and columns' x scales), all landing on full[s]; before it arrives there
// it writes the stage's Fp8StageInfo beside them. Every such stage receives
// Fp8ClusterWeightGradRing::kStageBytes of operands, its own loads and its peer's multicast. A tile
// of a group without tokens gets one stage without operands (slices 0), which tells its consumers
// so.
__device__ __forceinline__ void ProduceFp8ClusterWeightGradStages(
    const Fp8WeightGradParts& parts, const Fp8ClusterWeightGradRing& ring,
    const Fp8ClusterWeightGradSchedule& schedule, const RoundRobin& tiles, int rank, int n, int k) {
  for (int p = 0; p < parts.tokens.count; ++p) {
    PrefetchTensorMap(parts.tokens.dy[p]);
    PrefetchTensorMap(parts.tokens.x[p]);
  }
  constexpr uint16_t kBoth = (1u << kFp8WeightGradCluster) - 1;
  constexpr int kXBoxes = kFp8WeightGradTileN / kFp8BoxRows;
  const auto barriers = ring.Barriers<kFp8WeightGradCluster>();
  PipelineState<kFp8WeightGradStages> state;
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const WeightGradClusterTile tile = schedule.Find(t);
    const int m0 = tile.Row(rank);
    // n, k multiples of 4: whole 16-byte chunks; none past n (the last pair's second tile).
    const uint32_t dy_bytes = max(0, min(kFp8BlockM, n - m0)) * 4;
    const uint32_t x_bytes = min(kFp8WeightGradTileN, k - tile.n0) * 4;
    int stages = TokenTileCount(parts, tile.group);  // left to load, this one included
    if (stages == 0) {
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      *Fp8StageInfoOf(ring, state.stage) = {0, 1};
      MbarrierArrive(barriers.Full(state.stage));
      state.Advance();
      continue;
    }
    ForEachTokenTile(parts, tile.group, [&](const Fp8TokenTile& token_tile) {
      const int p = token_tile.part;
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      const uint32_t full = barriers.Full(state.stage);
      // Published by the arrival (release) to the consumers' wait (acquire).
      *Fp8StageInfoOf(ring, state.stage) = {token_tile.Slices(), --stages == 0};
      MbarrierArriveExpectTx(full, Fp8ClusterWeightGradRing::kStageBytes + dy_bytes + x_bytes);
      TmaLoad2d(parts.tokens.dy[p], ring.A(state.stage), full, token_tile.first, m0, L2EvictLast());
#pragma unroll
      for (int box = rank; box < kXBoxes; box += kFp8WeightGradCluster) {
        TmaLoad2dMulticast(parts.tokens.x[p], ring.B(state.stage) + box * kFp8BoxBytes, full, kBoth,
                           token_tile.first, tile.n0 + kFp8BoxRows * box, L2EvictLast());
      }
      const uint32_t scales = SmemAddress(Fp8ClusterStageScales(ring, state.stage));
      const int64_t slot = token_tile.slot;
      if (dy_bytes > 0) BulkLoad(scales, parts.dy_scales[p] + slot * n + m0, dy_bytes, full);
      BulkLoad(scales + kFp8BlockM * 4, parts.x_scales[p] + slot * k + tile.n0, x_bytes, full);
      state.Advance();
    });
  }
}

// Consumer warpgroup `consumer` (0 or 1): for each of its cluster's tiles, its 64 dw rows of its
// CTA's tile, from m0 + 64 consumer (none when they all lie past n: it only releases the stages).
// Per stage: part = the token tile's e4m3 products over its 32-token slices (Fp8TokenTile: up to 4
// wgmmas, fresh), then acc = fma(part, dy_scale[row] * x_scale[column], acc) for its rows Row()
// and Row() + 8 and its 48 columns (FragmentPosition), with the scales read from the stage before
// it is released (in both CTAs). Then its rows of dw_g = acc, or += acc with `accumulate` (TMA
// store or reduce-add of the rows and columns inside dw, through its staging; waits for them
// before it returns); a group without tokens in any part is skipped with `accumulate` and written
// as zeros without.
template <typename Out>
__device__ __forceinline__ void ConsumeFp8ClusterWeightGradTiles(
    const Fp8WeightGradParts& parts, const CUtensorMap& dw_map,
    const Fp8ClusterWeightGradRing& ring, const Fp8ClusterWeightGradSchedule& schedule,
    const RoundRobin& tiles, int rank, int n, int consumer, bool accumulate) {
  const FragmentPosition at;
  const int row = 64 * consumer + at.Row();  // in the tile; and row + 8
  const uint32_t staging =
      SmemAddress(ring.base + kFp8ClusterStagingOffset + consumer * kFp8ClusterStagingBytes);
  float acc[kFp8ClusterAccumulators], part[kFp8ClusterAccumulators];
  // Zeros only to define them: each tile's first wgmma drops them.
#pragma unroll
  for (int i = 0; i < kFp8ClusterAccumulators; ++i) part[i] = 0.0f;
  PipelineState<kFp8WeightGradStages> state;
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const WeightGradClusterTile tile = UniformTile(schedule.Find(t));
    const int m0 = tile.Row(rank) + 64 * consumer;  // its first dw row
    const bool active = m0 < n;                     // warp-uniform
#pragma unroll
    for (int i = 0; i < kFp8ClusterAccumulators; ++i) acc[i] = 0.0f;
    const uint32_t a_offset = consumer * kFp8BoxBytes;  // its 64 rows of A
    // Its stages, until the tile's last (each stage's Fp8StageInfo, read once it is full). One
    // flat loop: beside 192 accumulators, ptxas spilled hundreds of bytes where the consumers
    // walked the parts' token tiles themselves.
    bool last = false, any_tokens = false;
    while (!last) {
      bool multiply = false;  // this stage's products are scaled into acc (warp-uniform)
      MultiplyFp8Stage<kFp8WeightGradCluster>(
          part, ring, state, a_offset,
          [&](int stage) {
            const Fp8StageInfo info = *Fp8StageInfoOf(ring, stage);
            const int slices = WarpUniform(info.slices);
            last = WarpUniform(info.last) != 0;
            any_tokens = any_tokens || slices > 0;
            multiply = active && slices > 0;
            return multiply ? slices : 0;
          },
          [&](int stage) {
            if (multiply) {
              PromoteFp8WeightGradStage(acc, part, Fp8ClusterStageScales(ring, stage), row, at);
            }
          });
    }
    // No tokens: dw_g stays as it is (+=), or gets acc's zeros (=).
    if (!active || (!any_tokens && accumulate)) continue;
    WriteTile<Out, kFp8ClusterStagingBytes>(acc, dw_map, staging, 1 + consumer, accumulate,
                                            [&](int c) {
                                              return BoxOrigin{tile.n0 + c, m0, tile.group};
                                            });
  }
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
}

// dw_g (+)= sum over the parts of dy_p,g^T · x_p,g with the tile scales (see
// ../fp8_grouped_gemm_sm90.cuh), in clusters of kFp8WeightGradCluster CTAs; dw_map: dw (groups,
// n, k) of Out (EncodeWeightGradOutputMap); schedule: the cluster tiles of dw. kThreads threads,
// kFp8ClusterWeightGradSmemBytes of dynamic shared memory, any grid of whole clusters (persistent:
// cluster c takes cluster tiles c, c + clusters, ...).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GroupedWeightGradClusterKernel(const __grid_constant__ Fp8WeightGradParts parts,
                                      const __grid_constant__ CUtensorMap dw_map,
                                      Fp8ClusterWeightGradSchedule schedule, int groups, int n,
                                      int k, bool accumulate) {
#if MOE_SM90A_KERNELS
  static_assert(kFp8WeightGradCluster == 2, "a cluster tile is a pair of tiles");
  extern __shared__ uint8_t smem_raw[];
  const Fp8ClusterWeightGradRing ring(smem_raw);
  if (threadIdx.x == 0) ring.Barriers<kFp8WeightGradCluster>().Init();
  ClusterSync();  // every CTA's barriers are initialised before any multicast reaches them
  const RoundRobin tiles{ClusterIndex(), ClusterCount(), groups * schedule.PerGroup()};
  const int rank = ClusterRank();
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    DecreaseMaxRegisters<kFp8ClusterProducerRegisters>();
    if (threadIdx.x == 0)
      ProduceFp8ClusterWeightGradStages(parts, ring, schedule, tiles, rank, n, k);
  } else {
    IncreaseMaxRegisters<kFp8ClusterConsumerRegisters>();
    ConsumeFp8ClusterWeightGradTiles<Out>(parts, dw_map, ring, schedule, tiles, rank, n,
                                          warpgroup - 1, accumulate);
  }
  // No CTA leaves while its peer may still load into it or release a stage in it.
  __syncwarp();
  ClusterSync();
#else
  __trap();
#endif
}

}  // namespace detail

}  // namespace moe::cuda::sm90
