// The Hopper FP8 grouped weight gradient's kernel (design: ../fp8_grouped_gemm_sm90.cuh): dw_g
// (+)= the sum over parts of dy_p,g^T · x_p,g on QuantizeColumnTiles' forms (tokens contiguous,
// so both operands are K-major, as FP8 wgmma needs), scaled per token tile (up to 128 of a group's
// tokens), dw row and dw column, with the promotion once per token tile. A persistent launch of
// warp-specialised CTAs in one of two tile shapes (Fp8WeightGradShape): narrow, 128 x 128 dw tiles,
// a CTA alone; or wide, 128 x 192 dw tiles in clusters of two stacked along dw's rows, which share
// x's 192 columns. Warpgroup 0's thread 0 TMA-loads each token tile of its CTA's dy rows and x
// columns (wide: its part of them, multicast to both CTAs) and bulk-copies the tile's scales into
// a ring of stages (ProduceFp8WeightGradStages); warpgroups 1 and 2 each multiply 64 dw rows of
// the tile over the token tile's 32-token K slices, promote, and write or add (TMA store or
// reduce-add, staged through shared memory: epilogue.cuh's WriteTile) their rows of dw
// (ConsumeFp8WeightGradTiles).
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
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_parts.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda::sm90 {

// One part of an FP8 weight gradient's token rows, as ops::Fp8GroupedColumns holds them: dy_q (n,
// stride) and x_q (k, stride) e4m3, stride = Fp8ColumnTokens(groups, rows) (tokens contiguous,
// group g's from Fp8ColumnStart(g, offsets[g]), zeros after them up to a multiple of 32); dy_scales
// (slots, n) and x_scales (slots, k) f32, slots = Fp8ColumnTileSlots(groups, rows); offsets
// (groups + 1) int32 in device memory.
struct Fp8WeightGradRows {
  const uint8_t* dy_q;
  const float* dy_scales;
  const uint8_t* x_q;
  const float* x_scales;
  const int32_t* offsets;
  int64_t rows, stride;
};

// The parts of one launch, a kernel parameter (__grid_constant__: TMA reads the maps there).
// tokens: the bf16 kernel's parts (weight_grad_parts.cuh) with FP8 maps: dy_q as (stride, n), box
// (kFp8BlockK, 128), and x_q as (stride, k), box (kFp8BlockK, 64), uint8; the scales of each part
// beside them.
struct Fp8WeightGradParts {
  WeightGradParts tokens;
  const float* dy_scales[kMaxWeightGradParts];
  const float* x_scales[kMaxWeightGradParts];
};

// What the consumers learn of a stage besides its operands and scales: the K slices that hold its
// token tile's tokens (0: the stage of a group without tokens, which holds no operands), and
// whether it is its dw tile's last.
struct Fp8StageInfo {
  int slices, last;
};
static_assert(sizeof(Fp8StageInfo) <= 16);
static_assert(kFp8ColumnAlignment % kFp8WgmmaK == 0, "a group's last K slice ends in its zeros");
// The register split of both shapes (config.cuh's, with 16 more a producer thread: at 40 the wide
// shape's multicasts, scale copies and stage bookkeeping spilled; the consumers' 224 hold their
// 96 + 96 f32 without).
constexpr int kFp8WeightGradProducerRegisters = 56;
constexpr int kFp8WeightGradConsumerRegisters = 224;
static_assert(kFp8WeightGradProducerRegisters * kWarpgroupThreads +
                  kFp8WeightGradConsumerRegisters * kWarpgroupThreads * kConsumers <=
              kLaunchRegisters * kThreads);

// A tile shape of the weight gradient: each CTA tile 128 dw rows x kTileN dw columns; the
// schedule's cluster tiles (grouped_gemm_tiles.h's WeightGradClusterScheduleOf) two CTA tiles
// stacked along dw's rows, which share x's kTileN columns: with kCluster 2 a cluster's two CTAs
// take one each and multicast x's 64-row boxes to each other; with kCluster 1 a CTA takes both in
// turn. kStagingBoxes: a consumer's output staging in TMA boxes.
template <int kTileN_, int kCluster_, int kStagingBoxes>
struct Fp8WeightGradShape {
  static constexpr int kTileN = kTileN_;
  static constexpr int kCluster = kCluster_;
  static constexpr int kXBoxes = kTileN / kFp8BoxRows;
  using Ring = detail::Fp8Ring<kFp8WeightGradStages, kTileN>;
  using Schedule = WeightGradClusterScheduleOf<kTileN, 1>;
  static constexpr int kAccumulators = Ring::kAccumulators;  // f32 a thread
  static constexpr int kScaleFloats = kFp8BlockM + kTileN;   // a stage's dy and x scales
  // A stage's bytes beside its operands: its scales, then its Fp8StageInfo (16 bytes, so that the
  // next stage's scales stay 16-byte aligned for their bulk copies).
  static constexpr int kStageInfoBytes = kScaleFloats * 4 + 16;
  static constexpr int kStagingBytes = kStagingBoxes * kBoxBytes;
  // The bytes after the ring: each consumer's output staging (1024-byte aligned, as the 128-byte
  // swizzle of its TMA boxes needs), then each stage's scales; with the ring's base's alignment
  // slack (1023).
  static constexpr int kStagingOffset = (Ring::kExtraOffset + 1023) / 1024 * 1024;
  static constexpr int kScalesOffset = kStagingOffset + kConsumers * kStagingBytes;
  static constexpr int kSmemBytes = 1023 + kScalesOffset + kFp8WeightGradStages * kStageInfoBytes;
  static_assert(kSmemBytes <= 227 * 1024 && kTileN % kFp8BoxRows == 0);
  static_assert(kCluster == 1 || kCluster == 2, "a cluster tile is a pair of CTA tiles");
};
// Narrow: a group's few token tiles (one part at a few hundred tokens an expert) make each tile's
// output writes count, so the whole bf16 result is staged at once (f32 in two rounds).
using Fp8WeightGradNarrow = Fp8WeightGradShape<128, 1, 2>;
// Wide: with many token tiles a group the operands' L2 traffic bounds the kernel; a stage costs
// L2 28 KiB a CTA for 1.5 times a narrow tile's products (32 KiB). One staging box a consumer (3
// bf16 rounds, 6 f32) beside the 5 stages of 40 KiB (three boxes beside 4 stages spilled the
// epilogue's store addresses beside the products).
using Fp8WeightGradWide = Fp8WeightGradShape<192, 2, 1>;

namespace detail {

// A stage's scales: kFp8BlockM of dy (the CTA's dw rows), then kTileN of x (the tile's columns);
// then its Fp8StageInfo.
template <typename Shape>
__device__ __forceinline__ float* Fp8StageScales(const typename Shape::Ring& ring, int stage) {
  return reinterpret_cast<float*>(ring.base + Shape::kScalesOffset +
                                  stage * Shape::kStageInfoBytes);
}
template <typename Shape>
__device__ __forceinline__ Fp8StageInfo* Fp8StageInfoOf(const typename Shape::Ring& ring,
                                                        int stage) {
  return reinterpret_cast<Fp8StageInfo*>(Fp8StageScales<Shape>(ring, stage) + Shape::kScaleFloats);
}

// A token tile: `count` (1 to 128) tokens of a group from token `first` (a multiple of 32: where
// TMA loads it) of part `part`'s transposed rows, its scales in row `slot`; the consumers multiply
// its Slices() 32-token K slices (past the group's tokens the last one holds zeros).
struct Fp8TokenTile {
  int part, first, count, slot;

  __device__ int Slices() const { return (count + kFp8WgmmaK - 1) / kFp8WgmmaK; }
};

// Calls visit(tile) for each token tile of `group` (one stage each): the parts in order, in
// each the group's column tiles in order (fp8_scaling.h: Fp8ColumnTileRows, Fp8ColumnStart, and
// Fp8ColumnTileSlot, where its scales lie).
template <typename Visit>
__device__ __forceinline__ void ForEachTokenTile(const Fp8WeightGradParts& parts, int group,
                                                 Visit visit) {
  static_assert(kFp8BlockK == kFp8TileSize, "a token tile is a column tile");
  for (int p = 0; p < parts.tokens.count; ++p) {
    const RowRange range = PartRows(parts.tokens, p, group);
    const int start = static_cast<int>(Fp8ColumnStart(group, range.begin));
    const int slot = static_cast<int>(Fp8ColumnTileSlot(group, range.begin, 0));
    // Tile t: the group's rows from 128 t and slot + t (Fp8ColumnTileRows' and
    // Fp8ColumnTileSlot's rule, inline: through them the consumers spilled a register).
    for (int t = 0; t * kFp8BlockK < range.end - range.begin; ++t) {
      visit(Fp8TokenTile{p, start + t * kFp8BlockK,
                         min(kFp8BlockK, range.end - range.begin - t * kFp8BlockK), slot + t});
    }
  }
}

// How many token tiles ForEachTokenTile visits for `group`.
__device__ __forceinline__ int TokenTileCount(const Fp8WeightGradParts& parts, int group) {
  int count = 0;
  for (int p = 0; p < parts.tokens.count; ++p) {
    const RowRange range = PartRows(parts.tokens, p, group);
    count += (range.end - range.begin + kFp8BlockK - 1) / kFp8BlockK;
  }
  return count;
}

// Calls visit(tile, rank) for each of this CTA's tiles in order, `tile` its cluster tile and
// `rank` which of its two CTA tiles (rows tile.Row(rank)): the cluster tiles round-robin over the
// clusters; with a cluster of two the CTA's own rank's tile of each (also one past n, through
// which its consumers idle: the multicasts need both CTAs' stages), alone both of each in turn
// (but one past n).
template <typename Shape, typename Visit>
__device__ __forceinline__ void ForEachCtaTile(const typename Shape::Schedule& schedule, int groups,
                                               int n, Visit visit) {
  const RoundRobin tiles{ClusterIndex(), ClusterCount(), groups * schedule.PerGroup()};
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const WeightGradClusterTile tile = UniformTile(schedule.Find(t));
    if constexpr (Shape::kCluster == 2) {
      visit(tile, ClusterRank());
    } else {
      visit(tile, 0);
      if (tile.Row(1) < n) visit(tile, 1);
    }
  }
}

// The producer (thread 0 of warpgroup 0): for each of its CTA's tiles and each of its group's
// token tiles, waits until the next stage is empty (with a cluster, in both CTAs: their consumers
// release it in each) and loads into it, over 128 tokens from the token tile's first, dy_q's 128
// rows of its tile and x_q's kTileN rows as 64-row boxes (with a cluster, each CTA every second
// box from its rank's, multicast to both; TMA; rows past n or k and tokens past the stride are
// zero-filled and count toward the bytes), and bulk-copies its tile's scales of the token tile (its
// valid dw rows' dy scales and columns' x scales), all landing on full[s]; before it arrives there
// it writes the stage's Fp8StageInfo beside them. Every such stage receives Ring::kStageBytes of
// operands. A tile of a group without tokens gets one stage without operands (slices 0), which
// tells its consumers so.
template <typename Shape>
__device__ __forceinline__ void ProduceFp8WeightGradStages(const Fp8WeightGradParts& parts,
                                                           const typename Shape::Ring& ring,
                                                           const typename Shape::Schedule& schedule,
                                                           int groups, int n, int k) {
  for (int p = 0; p < parts.tokens.count; ++p) {
    PrefetchTensorMap(parts.tokens.dy[p]);
    PrefetchTensorMap(parts.tokens.x[p]);
  }
  constexpr uint16_t kAll = (1u << Shape::kCluster) - 1;
  const int first_box = Shape::kCluster == 1 ? 0 : ClusterRank();
  const auto barriers = ring.template Barriers<Shape::kCluster>();
  PipelineState<kFp8WeightGradStages> state;
  ForEachCtaTile<Shape>(schedule, groups, n, [&](const WeightGradClusterTile& tile, int rank) {
    const int m0 = tile.Row(rank);
    // n, k multiples of 4: whole 16-byte chunks; none past n (a pair's second tile).
    const uint32_t dy_bytes = max(0, min(kFp8BlockM, n - m0)) * 4;
    const uint32_t x_bytes = min(Shape::kTileN, k - tile.n0) * 4;
    int stages = TokenTileCount(parts, tile.group);  // left to load, this one included
    if (stages == 0) {
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      *Fp8StageInfoOf<Shape>(ring, state.stage) = {0, 1};
      MbarrierArrive(barriers.Full(state.stage));
      state.Advance();
      return;
    }
    ForEachTokenTile(parts, tile.group, [&](const Fp8TokenTile& token_tile) {
      const int p = token_tile.part;
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      const uint32_t full = barriers.Full(state.stage);
      // Published by the arrival (release) to the consumers' wait (acquire).
      *Fp8StageInfoOf<Shape>(ring, state.stage) = {token_tile.Slices(), --stages == 0};
      MbarrierArriveExpectTx(full, Shape::Ring::kStageBytes + dy_bytes + x_bytes);
      TmaLoad2d(parts.tokens.dy[p], ring.A(state.stage), full, token_tile.first, m0, L2EvictLast());
#pragma unroll
      for (int box = first_box; box < Shape::kXBoxes; box += Shape::kCluster) {
        const uint32_t to = ring.B(state.stage) + box * kFp8BoxBytes;
        const int row = tile.n0 + kFp8BoxRows * box;
        if constexpr (Shape::kCluster == 1) {
          TmaLoad2d(parts.tokens.x[p], to, full, token_tile.first, row, L2EvictLast());
        } else {
          TmaLoad2dMulticast(parts.tokens.x[p], to, full, kAll, token_tile.first, row,
                             L2EvictLast());
        }
      }
      const uint32_t scales = SmemAddress(Fp8StageScales<Shape>(ring, state.stage));
      const int64_t slot = token_tile.slot;
      if (dy_bytes > 0) BulkLoad(scales, parts.dy_scales[p] + slot * n + m0, dy_bytes, full);
      BulkLoad(scales + kFp8BlockM * 4, parts.x_scales[p] + slot * k + tile.n0, x_bytes, full);
      state.Advance();
    });
  });
}

// Consumer warpgroup `consumer` (0 or 1): for each of its CTA's tiles, its 64 dw rows of the
// tile, from m0 + 64 consumer (none when they all lie past n: it only releases the stages). Per
// stage: part = the token tile's e4m3 products over its 32-token slices (Fp8TokenTile: up to 4
// wgmmas, fresh), then acc = fma(part, dy_scale[row] * x_scale[column], acc) for its rows Row()
// and Row() + 8 and its kTileN / 4 columns (FragmentPosition), with the scales read from the stage
// before it is released (with a cluster, in both CTAs). Then its rows of dw_g = acc, or += acc
// with `accumulate` (TMA store or reduce-add of the rows and columns inside dw, through its
// staging; waits for them before it returns); a group without tokens in any part is skipped with
// `accumulate` and written as zeros without.
template <typename Shape, typename Out>
__device__ __forceinline__ void ConsumeFp8WeightGradTiles(const CUtensorMap& dw_map,
                                                          const typename Shape::Ring& ring,
                                                          const typename Shape::Schedule& schedule,
                                                          int groups, int n, int consumer,
                                                          bool accumulate) {
  constexpr int kAccumulators = Shape::kAccumulators;
  const FragmentPosition at;
  const int row = 64 * consumer + at.Row();  // in the tile; and row + 8
  const uint32_t staging =
      SmemAddress(ring.base + Shape::kStagingOffset + consumer * Shape::kStagingBytes);
  float acc[kAccumulators], part[kAccumulators];
  // Zeros only to define them: each tile's first wgmma drops them.
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) part[i] = 0.0f;
  PipelineState<kFp8WeightGradStages> state;
  ForEachCtaTile<Shape>(schedule, groups, n, [&](const WeightGradClusterTile& tile, int rank) {
    const int m0 = tile.Row(rank) + 64 * consumer;  // its first dw row
    const bool active = m0 < n;                     // warp-uniform
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    const uint32_t a_offset = consumer * kFp8BoxBytes;  // its 64 rows of A
    // Its stages, until the tile's last (each stage's Fp8StageInfo, read once it is full). One
    // flat loop: beside 192 accumulators, ptxas spilled hundreds of bytes where the consumers
    // walked the parts' token tiles themselves.
    bool last = false, any_tokens = false;
    while (!last) {
      bool multiply = false;  // this stage's products are scaled into acc (warp-uniform)
      MultiplyFp8Stage<Shape::kCluster>(
          part, ring, state, a_offset,
          [&](int stage) {
            const Fp8StageInfo info = *Fp8StageInfoOf<Shape>(ring, stage);
            const int slices = WarpUniform(info.slices);
            last = WarpUniform(info.last) != 0;
            any_tokens = any_tokens || slices > 0;
            multiply = active && slices > 0;
            return multiply ? slices : 0;
          },
          [&](int stage) {
            if (!multiply) return;
            const float* const scales = Fp8StageScales<Shape>(ring, stage);
            const float dy_scale[2] = {scales[row], scales[row + 8]};
        // Register 4 i + 2 h + j holds row Row() + 8 h, column 8 i + Column() + j.
#pragma unroll
            for (int i = 0; i < kAccumulators / 4; ++i) {
              const float2 x_scale =
                  *reinterpret_cast<const float2*>(scales + kFp8BlockM + 8 * i + at.Column());
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                acc[4 * i + 2 * h] =
                    fmaf(part[4 * i + 2 * h], dy_scale[h] * x_scale.x, acc[4 * i + 2 * h]);
                acc[4 * i + 2 * h + 1] =
                    fmaf(part[4 * i + 2 * h + 1], dy_scale[h] * x_scale.y, acc[4 * i + 2 * h + 1]);
              }
            }
          });
    }
    // No tokens: dw_g stays as it is (+=), or gets acc's zeros (=).
    if (!active || (!any_tokens && accumulate)) return;
    WriteTile<Out, Shape::kStagingBytes>(acc, dw_map, staging, 1 + consumer, accumulate,
                                         [&](int c) {
                                           return BoxOrigin{tile.n0 + c, m0, tile.group};
                                         });
  });
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
}

// dw_g (+)= sum over the parts of dy_p,g^T · x_p,g with the tile scales (see
// ../fp8_grouped_gemm_sm90.cuh) in Shape's tiles; dw_map: dw (groups, n, k) of Out
// (EncodeWeightGradOutputMap); schedule: the cluster tiles of dw. kThreads threads,
// Shape::kSmemBytes of dynamic shared memory, any grid of whole clusters of Shape::kCluster
// (persistent: cluster c takes cluster tiles c, c + clusters, ...).
template <typename Shape, typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GroupedWeightGradKernel(const __grid_constant__ Fp8WeightGradParts parts,
                               const __grid_constant__ CUtensorMap dw_map,
                               typename Shape::Schedule schedule, int groups, int n, int k,
                               bool accumulate) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const typename Shape::Ring ring(smem_raw);
  if (threadIdx.x == 0) ring.template Barriers<Shape::kCluster>().Init();
  // Every CTA's barriers are initialised before any multicast reaches them.
  if constexpr (Shape::kCluster == 1) {
    __syncthreads();
  } else {
    ClusterSync();
  }
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    DecreaseMaxRegisters<kFp8WeightGradProducerRegisters>();
    if (threadIdx.x == 0) ProduceFp8WeightGradStages<Shape>(parts, ring, schedule, groups, n, k);
  } else {
    IncreaseMaxRegisters<kFp8WeightGradConsumerRegisters>();
    ConsumeFp8WeightGradTiles<Shape, Out>(dw_map, ring, schedule, groups, n, warpgroup - 1,
                                          accumulate);
  }
  if constexpr (Shape::kCluster == 2) {
    // No CTA leaves while its peer may still load into it or release a stage in it.
    __syncwarp();
    ClusterSync();
  }
#else
  __trap();
#endif
}

}  // namespace detail

}  // namespace moe::cuda::sm90
