// The producer of the Hopper grouped GEMMs' forward kernel (design: ../grouped_gemm_sm90.cuh):
// one thread that walks its cluster's units and TMA-loads each k-block's x rows and w columns
// into the stage ring, sharing (multicasting) the operand its cluster tile's two CTAs have in
// common.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/pipeline.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/tile_scheduler.cuh"

namespace moe::cuda::sm90::detail {

// The TMA loads of one forward stage into this CTA (or, with mask != 0, into every CTA of the
// cluster in the mask, at the same shared offsets): rows of x as 64-row boxes, columns of w in
// kBlockN / 2-column halves. Half h of the tile at `column` is w's columns column + kBlockN / 2 h;
// with kSwiglu the tile's columns count double (see GroupedMatmulKernel): half 0 is the gate
// columns from column / 2, half 1 their up columns, f further.
template <bool kTransposeW, bool kSwiglu>
struct ForwardLoads {
  const CUtensorMap& x_map;
  const CUtensorMap& w_map;
  uint32_t full;  // the stage's full barrier
  int k0;         // the stage's first K index
  int f;          // kSwiglu: the gate (and up) columns of w

  // x rows [row, row + 64) into `a`.
  __device__ void XBox(uint32_t a, uint16_t mask, int row) const {
    if (mask != 0) {
      TmaLoad2dMulticast(x_map, a, full, mask, k0, row, L2EvictNormal());
    } else {
      TmaLoad2d(x_map, a, full, k0, row, L2EvictNormal());
    }
  }

  // Half `half` of the tile at `column` of `group`'s w into `b` (128 K-major rows, or 2 MN-major
  // 64 x 64 boxes).
  __device__ void WHalf(uint32_t b, uint16_t mask, int column, int half, int group) const {
    const int first = kSwiglu ? column / 2 + half * f : column + kBlockN / 2 * half;
    if constexpr (kTransposeW) {
      Box3d(b, mask, k0, first, group);
    } else {
#pragma unroll
      for (int box = 0; box < kBlockN / 2 / 64; ++box) {
        Box3d(b + box * kBoxBytes, mask, first + 64 * box, k0, group);
      }
    }
  }

 private:
  __device__ void Box3d(uint32_t dst, uint16_t mask, int c0, int c1, int c2) const {
    if (mask != 0) {
      TmaLoad3dMulticast(w_map, dst, full, mask, c0, c1, c2, L2EvictLast());
    } else {
      TmaLoad3d(w_map, dst, full, c0, c1, c2, L2EvictLast());
    }
  }
};

// The forward kernel's producer (thread 0 of warpgroup 0): for each unit of `units` (this
// cluster's, of plan) and each of its k-blocks, waits until the next stage is empty and loads
// the unit's cluster tile's operands into it (ForwardLoads). A row pair's CTAs each load
// their own x rows and half of the shared w columns into both; a column pair's each load half
// of the shared x rows into both and their own w columns. f: as ForwardLoads.
template <bool kTransposeW, bool kSwiglu, int kStages>
__device__ __forceinline__ void ProduceForwardStages(
    const CUtensorMap& x_map, const CUtensorMap& w_map, const StageRing<kStages>& ring,
    const StageBarriers<kStages, kForwardCluster>& barriers, const ClusterTileSchedule& schedule,
    const TailSplit& plan, const RoundRobin& units, int rank, int f) {
  PrefetchTensorMap(x_map);
  PrefetchTensorMap(w_map);
  constexpr uint16_t kBoth = (1u << kForwardCluster) - 1;
  PipelineState<kStages> state;
  for (int u = units.first; u < units.end; u += units.step) {
    const TileUnit unit = plan.Find(u);
    const ClusterTile tile = schedule.Find(unit.tile);
    // x's second box of this CTA's tile is loaded only where it holds rows of the group (a
    // short last row tile's lie past it; its consumer idles).
    const bool second_box = tile.Row(rank) + 64 < tile.row_end;
    for (int kb = unit.k_begin; kb < unit.k_end; ++kb) {
      MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
      const uint32_t full = barriers.Full(state.stage);
      // Every CTA's stage receives its own loads and its peer's multicast: w's tile and x's
      // boxes.
      MbarrierArriveExpectTx(full, kStageBBytes + (second_box ? 2 : 1) * kBoxBytes);
      const ForwardLoads<kTransposeW, kSwiglu> load{x_map, w_map, full, kb * kBlockK, f};
      const uint32_t a = ring.A(state.stage), b = ring.B(state.stage);
      if (tile.row_pair) {  // own rows of x; half `rank` of the shared w columns to both
        load.XBox(a, 0, tile.Row(rank));
        if (second_box) load.XBox(a + kBoxBytes, 0, tile.Row(rank) + 64);
        load.WHalf(b + rank * (kStageBBytes / 2), kBoth, tile.n0, rank, tile.group);
      } else {  // 64-row half `rank` of the shared x rows to both; own w columns
        if (rank == 0 || second_box) {
          load.XBox(a + rank * kBoxBytes, kBoth, tile.row0 + 64 * rank);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          load.WHalf(b + half * (kStageBBytes / 2), 0, tile.Column(rank), half, tile.group);
        }
      }
      state.Advance();
    }
  }
}

}  // namespace moe::cuda::sm90::detail
