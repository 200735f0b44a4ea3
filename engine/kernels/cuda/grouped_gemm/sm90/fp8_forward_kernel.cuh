// The Hopper FP8 grouped GEMM's forward kernel (design: ../fp8_grouped_gemm_sm90.cuh): y (=) = xq ·
// wq_g^T per group on e4m3 operands, both K-major, with DeepSeek-V3's blockwise scales applied
// once per 128-wide K tile into f32 accumulators. A persistent launch of warp-specialised CTAs in
// clusters of two, each cluster tile a pair of 128 x 192 tiles that share an operand
// (grouped_gemm_tiles.h's ClusterTileScheduleOf<kFp8ForwardTileN>): warpgroup 0's thread 0
// TMA-loads each K tile's operands into a ring of stages, its own and its part of the shared one,
// which it multicasts to both CTAs (ProduceFp8Stages); warpgroups 1 and 2 each multiply 64 rows of
// their CTA's tile and promote the tile's partial sums (ConsumeFp8Tiles), then write their rows of
// y through a TMA box of shared memory each (epilogue.cuh's WriteTile, or WriteRows for a group's
// last rows). The ring and a stage's multiplication are fp8_mainloop.cuh's, shared with the
// weight gradient.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/tile_scheduler.cuh"

namespace moe::cuda::sm90 {

namespace detail {
using Fp8ForwardRing = Fp8Ring<kFp8ForwardStages, kFp8ForwardTileN>;
// A consumer's f32 a thread: its 64 x 192 accumulators, and as many partial sums of a K tile.
constexpr int kFp8ForwardAccumulators = Fp8ForwardRing::kAccumulators;
}  // namespace detail

// After the stage ring: the offsets and the tile prefix (kMaxGroups + 1 ints each), then each
// consumer's output staging, one TMA box (1024-byte aligned, as the 128-byte swizzle needs); with
// the ring's base's alignment slack (1023).
constexpr int kFp8ForwardStagingOffset =
    (detail::Fp8ForwardRing::kExtraOffset + 2 * (kMaxGroups + 1) * 4 + 1023) / 1024 * 1024;
constexpr int kFp8SmemBytes = 1023 + kFp8ForwardStagingOffset + kConsumers * kBoxBytes;
static_assert(kFp8SmemBytes <= 227 * 1024);

constexpr int kFp8ForwardCluster = 2;  // CTAs sharing (multicasting) an operand tile

namespace detail {

static_assert(kFp8BlockM == kBlockM, "the cluster tile schedule's rows");
using Fp8ClusterSchedule = ClusterTileScheduleOf<kFp8ForwardTileN>;
using Fp8ClusterTile = ClusterTileOf<kFp8ForwardTileN>;
// A tile's first column is a multiple of 192: at 0 or 64 into a 128-column weight scale block,
// so its columns span two blocks, split at tile column 128 or 64.
static_assert(kFp8ForwardTileN == 192 && kFp8BlockN == 128);

// The forward's bytes after the stage ring (Fp8Ring::Extra): the offsets, then the tile prefix.
__device__ __forceinline__ int* Fp8Offsets(const Fp8ForwardRing& ring) {
  return reinterpret_cast<int*>(ring.Extra());
}
__device__ __forceinline__ int* Fp8TilePrefix(const Fp8ForwardRing& ring) {
  return Fp8Offsets(ring) + kMaxGroups + 1;
}
// Consumer `consumer`'s output staging (one TMA box).
__device__ __forceinline__ uint8_t* Fp8ForwardStaging(const Fp8ForwardRing& ring, int consumer) {
  return ring.base + kFp8ForwardStagingOffset + consumer * kBoxBytes;
}

// The producer (thread 0 of warpgroup 0): for each of its cluster's tiles (`tiles`) and each K
// tile, waits until the next stage is empty (in both CTAs: their consumers release it in each)
// and loads the K tile of its CTA's x rows and w rows into it, as 64-row boxes: a row pair's CTAs
// each load their own 128 x rows, and the shared 192 w rows' three boxes into both CTAs (rank 0
// boxes 0 and 2, rank 1 box 1); a column pair's each load half `rank` of the shared x rows into
// both and their own w rows. Every stage receives Fp8ForwardRing::kStageBytes, its own loads and
// its peer's multicast. Rows past the tensors and K past k are zero-filled (they count toward the
// stage's bytes).
__device__ __forceinline__ void ProduceFp8Stages(const CUtensorMap& x_map, const CUtensorMap& w_map,
                                                 const Fp8ForwardRing& ring,
                                                 const Fp8ClusterSchedule& schedule,
                                                 const RoundRobin& tiles, int rank, int k_tiles) {
  PrefetchTensorMap(x_map);
  PrefetchTensorMap(w_map);
  constexpr uint16_t kBoth = (1u << kFp8ForwardCluster) - 1;
  const auto barriers = ring.Barriers<kFp8ForwardCluster>();
  PipelineState<kFp8ForwardStages> state;
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const Fp8ClusterTile tile = schedule.Find(t);
    for (int kt = 0; kt < k_tiles; ++kt) {
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      const uint32_t full = barriers.Full(state.stage);
      MbarrierArriveExpectTx(full, Fp8ForwardRing::kStageBytes);
      const int k0 = kt * kFp8BlockK;
      const uint32_t a = ring.A(state.stage), b = ring.B(state.stage);
      // A 64-row box of x from row `row`, or of the group's w from row `column`, into `dst`,
      // multicast to the CTAs in `mask` (0: this CTA only).
      const auto x_box = [&](uint32_t dst, uint16_t mask, int row) {
        if (mask != 0) {
          TmaLoad2dMulticast(x_map, dst, full, mask, k0, row, L2EvictNormal());
        } else {
          TmaLoad2d(x_map, dst, full, k0, row, L2EvictNormal());
        }
      };
      const auto w_box = [&](uint32_t dst, uint16_t mask, int column) {
        if (mask != 0) {
          TmaLoad3dMulticast(w_map, dst, full, mask, k0, column, tile.group, L2EvictLast());
        } else {
          TmaLoad3d(w_map, dst, full, k0, column, tile.group, L2EvictLast());
        }
      };
      constexpr int kWBoxes = kFp8ForwardTileN / kFp8BoxRows;
      if (tile.row_pair) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          x_box(a + h * kFp8BoxBytes, 0, tile.Row(rank) + kFp8BoxRows * h);
        }
#pragma unroll
        for (int h = rank; h < kWBoxes; h += kFp8ForwardCluster) {
          w_box(b + h * kFp8BoxBytes, kBoth, tile.n0 + kFp8BoxRows * h);
        }
      } else {
        x_box(a + rank * kFp8BoxBytes, kBoth, tile.row0 + kFp8BoxRows * rank);
#pragma unroll
        for (int h = 0; h < kWBoxes; ++h) {
          w_box(b + h * kFp8BoxBytes, 0, tile.Column(rank) + kFp8BoxRows * h);
        }
      }
      state.Advance();
    }
  }
}

// acc[i] += part[i] times its row's and column's scale: `scales` = {x0 w0, x0 w1, x1 w0, x1 w1}
// for rows Row() (x0) and Row() + 8 (x1) and the tile's columns before kSplit (w0) and from it
// (w1). Register 4 b + 2 h + j holds row Row() + 8 h, column 8 b + Column() + j (FragmentPosition).
template <int kSplit, int kCount>
__device__ __forceinline__ void PromoteFp8Split(float (&acc)[kCount], const float (&part)[kCount],
                                                float4 scales) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const bool right = 8 * (i / 4) >= kSplit, lower = i % 4 >= 2;
    const float scale = lower ? (right ? scales.w : scales.z) : (right ? scales.y : scales.x);
    acc[i] = fmaf(part[i], scale, acc[i]);
  }
}

// Consumer warpgroup `consumer` (0 or 1): for each of its cluster's tiles, its 64 rows of its
// CTA's tile (ConsumerTile; none when they lie past the group's end or its columns past n: it only
// releases the stages). Per K tile kt: its scales are loaded, the stage's e4m3 products issued
// into `part` (4 wgmmas, fresh) and waited for, the stage released, and acc = fma(part,
// x_scale[row, kt] * w_scale[group, block, kt], acc) for its rows Row() and Row() + 8
// (FragmentPosition) and the tile's two weight scale blocks (PromoteFp8Split); while one consumer
// promotes, the other's wgmmas keep the tensor cores busy. Then its valid rows and columns of y =
// acc, rounded to Out, through its staging box (Fp8ForwardStaging): 64 valid rows by TMA stores to
// y_map (clipped to n), fewer copied by its threads (WriteRows); the stores drain while it goes on,
// and it waits for them before it returns.
template <typename Out>
__device__ __forceinline__ void ConsumeFp8Tiles(const Fp8ForwardRing& ring,
                                                const CUtensorMap& y_map, const float* x_scales,
                                                const float* w_scales,
                                                const Fp8ClusterSchedule& schedule,
                                                const RoundRobin& tiles, int rank, int n,
                                                int k_tiles, int consumer, Out* y) {
  const FragmentPosition at;
  uint8_t* const staging = Fp8ForwardStaging(ring, consumer);
  const int barrier = 1 + consumer;  // its named barrier (WriteTile, WriteRows)
  const int n_blocks = (n + kFp8BlockN - 1) / kFp8BlockN;
  const uint32_t a_offset = consumer * kFp8BoxBytes;  // its 64 rows of A
  float acc[kFp8ForwardAccumulators], part[kFp8ForwardAccumulators];
  // Zeros only to define them: each K tile's first wgmma drops them.
#pragma unroll
  for (int i = 0; i < kFp8ForwardAccumulators; ++i) part[i] = 0.0f;
  PipelineState<kFp8ForwardStages> state;
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const Fp8ClusterTile tile = UniformTile(schedule.Find(t));
    const ConsumerTile mine(tile, rank, consumer, n);
    const bool active = mine.active;  // warp-uniform
    const int row0 = mine.first_row + at.Row(), row1 = row0 + 8;
    // Rows past the group's end get scale 0 (their results are not stored).
    const float* const xs0 = row0 < tile.row_end ? x_scales + int64_t{row0} * k_tiles : nullptr;
    const float* const xs1 = row1 < tile.row_end ? x_scales + int64_t{row1} * k_tiles : nullptr;
    // The tile's two scale blocks (the second clamped to the last: past n its columns are zeros).
    const int block = mine.column / kFp8BlockN;
    const float* const ws0 = w_scales + (int64_t{tile.group} * n_blocks + block) * k_tiles;
    const float* const ws1 = ws0 + (block + 1 < n_blocks ? k_tiles : 0);
    const bool split_at_64 = mine.column % kFp8BlockN != 0;  // else at 128
#pragma unroll
    for (int i = 0; i < kFp8ForwardAccumulators; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < k_tiles; ++kt) {
      float4 scales = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // loaded before the stage's wait
      if (active) {
        const float w0 = ws0[kt], w1 = ws1[kt];
        const float x0 = xs0 != nullptr ? xs0[kt] : 0.0f, x1 = xs1 != nullptr ? xs1[kt] : 0.0f;
        scales = make_float4(x0 * w0, x0 * w1, x1 * w0, x1 * w1);
      }
      MultiplyFp8Stage<kFp8ForwardCluster>(
          part, ring, state, a_offset, [&](int) { return active ? kFp8StageSlices : 0; },
          [](int) {});
      if (!active) continue;
      if (split_at_64) {
        PromoteFp8Split<64>(acc, part, scales);
      } else {
        PromoteFp8Split<128>(acc, part, scales);
      }
    }
    if (!active) continue;
    WriteOutputRows<Out, kBoxBytes>(acc, y_map, y, SmemAddress(staging), staging, barrier,
                                    mine.first_row, mine.column, mine.valid_rows, n);
  }
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
}

// y = xq · wq_g^T per group with the blockwise scales (see ../fp8_grouped_gemm_sm90.cuh), in
// clusters of kFp8ForwardCluster CTAs. x_map: xq as (k, rows) uint8, box (128, 64); w_map: wq as
// (k, n, groups), box (128, 64, 1); x_scales (rows, ceil(k / 128)), w_scales (groups, ceil(n /
// 128), ceil(k / 128)) f32; y (rows, n), y_map: y as (n, rows, 1), box (kWriteColumns<Out>, 64,
// 1). kThreads threads, kFp8SmemBytes of dynamic shared memory, any grid of whole clusters
// (persistent: cluster c takes cluster tiles c, c + clusters, ...).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GroupedMatmulKernel(const __grid_constant__ CUtensorMap x_map,
                           const __grid_constant__ CUtensorMap w_map,
                           const __grid_constant__ CUtensorMap y_map, const float* x_scales,
                           const float* w_scales, const int32_t* device_offsets, int groups,
                           int rows, int n, int k, Out* y) {
#if MOE_SM90A_KERNELS
  static_assert(kFp8ForwardCluster == 2, "a cluster tile is a pair of tiles");
  extern __shared__ uint8_t smem_raw[];
  const Fp8ForwardRing ring(smem_raw);
  if (threadIdx.x == 0) ring.Barriers<kFp8ForwardCluster>().Init();
  const int n_tiles = (n + kFp8ForwardTileN - 1) / kFp8ForwardTileN;
  int* const offsets = Fp8Offsets(ring);
  int* const tile_prefix = Fp8TilePrefix(ring);
  BuildClusterTileSchedule(device_offsets, groups, rows, n_tiles, offsets, tile_prefix);
  ClusterSync();  // every CTA's barriers are initialised before any multicast reaches them
  const Fp8ClusterSchedule schedule{offsets, tile_prefix, groups, n_tiles};
  const RoundRobin tiles{ClusterIndex(), ClusterCount(), WarpUniform(schedule.Total())};
  const int rank = ClusterRank();
  const int k_tiles = (k + kFp8BlockK - 1) / kFp8BlockK;
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x == 0) ProduceFp8Stages(x_map, w_map, ring, schedule, tiles, rank, k_tiles);
  } else {
    IncreaseMaxRegisters<kConsumerRegisters>();
    ConsumeFp8Tiles<Out>(ring, y_map, x_scales, w_scales, schedule, tiles, rank, n, k_tiles,
                         warpgroup - 1, y);
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
