// The Hopper grouped GEMMs' weight-gradient kernel (design: ../grouped_gemm_sm90.cuh): dw_g (+)=
// the sum over parts of dy_p,g^T · x_p,g, as a persistent launch of warp-specialised CTAs in
// clusters of two that share x's columns. Warpgroup 0's first warp produces (TMA loads, and the
// zeroing of rows past a group's end: weight_grad_parts.cuh); warpgroups 1 and 2 consume (the
// mainloop: mainloop.cuh) and write or add their tile of dw (epilogue.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/pipeline.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/tile_scheduler.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_parts.cuh"

namespace moe::cuda::sm90::detail {

using WeightGradRing = StageRing<kWeightGradStages>;
using WeightGradBarriers = StageBarriers<kWeightGradStages, kWeightGradCluster>;

// The TMA loads of one weight-gradient stage (the issuing thread): this CTA's dy columns of its
// tile (kBlockM of them, as 64-row boxes) and its half of x's kBlockN columns, multicast into
// both CTAs of the cluster, over the K rows [row, row + kBlockK); their bytes land on `landing`.
__device__ __forceinline__ void LoadWeightGradStage(
    const CUtensorMap& dy_map, const CUtensorMap& x_map, const WeightGradRing& ring, int stage,
    uint32_t landing, const WeightGradClusterTile& tile, int rank, int row) {
  constexpr uint16_t kBoth = (1u << kWeightGradCluster) - 1;
  constexpr int kXBoxes = kBlockN / 64 / kWeightGradCluster;  // x boxes this CTA loads
  // Every CTA's stage receives kStageBytes: its own dy columns, its half of x's columns and its
  // peer's half.
  MbarrierArriveExpectTx(landing, kStageBytes);
#pragma unroll
  for (int box = 0; box < kBlockM / 64; ++box) {
    TmaLoad2d(dy_map, ring.A(stage) + box * kBoxBytes, landing, tile.Row(rank) + 64 * box, row,
              L2EvictLast());
  }
#pragma unroll
  for (int i = 0; i < kXBoxes; ++i) {
    const int box = rank * kXBoxes + i;
    TmaLoad2dMulticast(x_map, ring.B(stage) + box * kBoxBytes, landing, kBoth, tile.n0 + 64 * box,
                       row, L2EvictLast());
  }
}

// The weight-gradient kernel's producer warp (warp 0; thread 0 issues the loads): for each of
// this cluster's tiles, each part and each 64-row K step of the tile's group in it, waits until
// the next stage is empty and loads it (LoadWeightGradStage). Where the step's last slice that
// the consumers read holds rows past the group's end, the loads land on the stage's landed
// barrier instead, the warp zeroes those rows in this CTA's copy of the stage (ZeroRowsPastEnd)
// and only then marks the stage full.
__device__ __forceinline__ void ProduceWeightGradStages(const WeightGradParts& parts,
                                                        const WeightGradRing& ring,
                                                        const WeightGradBarriers& barriers,
                                                        const WeightGradClusterSchedule& schedule,
                                                        const RoundRobin& tiles, int rank) {
  const bool issuer = threadIdx.x == 0;
  if (issuer) {
    for (int p = 0; p < parts.count; ++p) {
      PrefetchTensorMap(parts.dy[p]);
      PrefetchTensorMap(parts.x[p]);
    }
  }
  PipelineState<kWeightGradStages> state;
  uint32_t landed_phases = 0;  // bit s: parity of landed[s]'s next phase
  static_assert(kWeightGradStages <= 32);
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const WeightGradClusterTile tile = schedule.Find(t);
    for (int p = 0; p < parts.count; ++p) {
      const CUtensorMap& dy_map = parts.dy[p];
      const CUtensorMap& x_map = parts.x[p];
      const RowRange range = PartRows(parts, p, tile.group);
      for (int row = range.begin; row < range.end; row += kBlockK) {
        MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
        const int valid = min(kBlockK, range.end - row);
        const bool masked = valid < ReadRows(valid);  // rows to zero before the consumers
        const uint32_t landing = masked ? barriers.Landed(state.stage) : barriers.Full(state.stage);
        if (issuer) LoadWeightGradStage(dy_map, x_map, ring, state.stage, landing, tile, rank, row);
        if (masked) {  // every CTA of the cluster masks its own copy of the stage
          MbarrierWait(landing, (landed_phases >> state.stage) & 1);
          landed_phases ^= 1u << state.stage;
          ZeroRowsPastEnd(ring.APointer(state.stage), ring.BPointer(state.stage), valid);
          FenceProxyAsync();
          __syncwarp();
          if (issuer) MbarrierArrive(barriers.Full(state.stage));
        }
        state.Advance();
      }
    }
  }
}

// Consumer warpgroup `consumer` (0 or 1) of the weight-gradient kernel: for each of this
// cluster's tiles, its 64 dw rows' mainloop over the group's rows in every part (PartSlices:
// the last step of each part only as deep as its rows), then the rows written (or added, with
// `accumulate`) to dw. A group without rows is skipped with `accumulate` (dw_g stays) and
// written as zeros without. Waits for its TMA writes before it returns.
template <typename Out>
__device__ __forceinline__ void ConsumeWeightGradTiles(
    const WeightGradParts& parts, const CUtensorMap& dw_map, const WeightGradRing& ring,
    const WeightGradBarriers& barriers, const WeightGradClusterSchedule& schedule,
    const RoundRobin& tiles, int rank, int consumer, int n, bool accumulate) {
  const uint32_t staging = SmemAddress(ring.Extra() + consumer * kWeightGradStagingBytes);
  Accumulators acc;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  PipelineState<kWeightGradStages> state;
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
    const WeightGradClusterTile tile = UniformTile(schedule.Find(t));
    int k_blocks = 0;
    for (int p = 0; p < parts.count; ++p) {
      const RowRange range = PartRows(parts, p, tile.group);
      k_blocks += (range.end - range.begin + kBlockK - 1) / kBlockK;
    }
    k_blocks = WarpUniform(k_blocks);
    if (k_blocks == 0 && accumulate) continue;  // no rows: dw_g stays as it is
    const int row0 = tile.Row(rank) + 64 * consumer;
    const bool active = row0 < n;
    const auto a_descriptor = [&](int stage, int slice) {
      return MNMajorDescriptor(ring.A(stage) + consumer * kBoxBytes, slice);
    };
    const auto b_descriptor = [&](int stage, int slice) {
      return MNMajorDescriptor(ring.B(stage), slice);
    };
    MultiplyStages<1, 1>(acc, k_blocks, active, barriers, state, a_descriptor, b_descriptor,
                         PartSlices(parts, tile.group));
    if (!active) continue;
    if (k_blocks == 0) {  // no rows, and dw_g =: zeros (no wgmma cleared the accumulators)
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    }
    WriteTile<Out, kWeightGradStagingBytes>(acc, dw_map, staging, 1 + consumer, accumulate,
                                            [&](int c) {
                                              return BoxOrigin{tile.n0 + c, row0, tile.group};
                                            });
  }
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
}

// dw_g (+)= sum over the parts p of dy_p,g^T · x_p,g (see grouped_gemm_sm90.cuh), in clusters of
// kWeightGradCluster CTAs sharing (multicasting) x's columns. The operands are MN-major (each
// token row is a K row); a tile's reduction runs over its group's rows in each part in turn.
// dw_map: dw (Out) as (k, n, groups), box (kWriteColumns<Out>, 64, 1); schedule: the cluster
// tiles of dw (grouped_gemm_tiles.h).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedWeightGradKernel(const __grid_constant__ WeightGradParts parts,
                            const __grid_constant__ CUtensorMap dw_map,
                            WeightGradClusterSchedule schedule, int groups, int n,
                            bool accumulate) {
#if MOE_SM90A_KERNELS
  static_assert(kWeightGradCluster == 2, "a cluster tile is a pair of tiles");
  extern __shared__ uint8_t smem_raw[];
  const WeightGradRing ring(smem_raw);
  const auto barriers = ring.Barriers<kWeightGradCluster>();
  if (threadIdx.x == 0) barriers.Init();
  ClusterSync();  // every CTA's barriers are initialised before any multicast reaches them
  const int total = groups * schedule.PerGroup();
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  const int rank = ClusterRank();
  const int first_tile = ClusterIndex(), tile_step = ClusterCount();
  const RoundRobin tiles{first_tile, tile_step, total};

  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x < 32) {  // the producer warp; its lanes mask the stages past a group's end
      ProduceWeightGradStages(parts, ring, barriers, schedule, tiles, rank);
    }
  } else {
    IncreaseMaxRegisters<kConsumerRegisters>();
    ConsumeWeightGradTiles<Out>(parts, dw_map, ring, barriers, schedule, tiles, rank, warpgroup - 1,
                                n, accumulate);
  }
  // No CTA leaves while its peer may still release a stage in it or multicast into it.
  __syncwarp();
  ClusterSync();
#else
  __trap();
#endif
}

constexpr int kWeightGradSmemBytes =
    StageRing<kWeightGradStages>::kBytesBeforeExtra + kConsumers * kWeightGradStagingBytes;
static_assert(kWeightGradSmemBytes <= 227 * 1024);

}  // namespace moe::cuda::sm90::detail
