// The device side of the Hopper grouped GEMMs' tile schedules (grouped_gemm_tiles.h; design:
// ../grouped_gemm_sm90.cuh): each CTA's copy of the offsets and its prefix of cluster tiles per
// group, the round-robin walk of the clusters over them, a consumer's part of a forward cluster
// tile, and tiles and units held in warp-uniform registers.
#pragma once

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"

namespace moe::cuda::sm90::detail {

// The work a cluster takes in a persistent launch, round-robin over the clusters: items first,
// first + step, ... below end (cluster tiles, or TailSplit's units).
struct RoundRobin {
  int first, step, end;
};

// `tile` in registers the compiler knows to be warp-uniform (see WarpUniform); one overload per
// tile kind.
template <int kTileN>
__device__ __forceinline__ ClusterTileOf<kTileN> UniformTile(const ClusterTileOf<kTileN>& tile) {
  return {WarpUniform(tile.group), WarpUniform(tile.row0), WarpUniform(tile.row_end),
          WarpUniform(tile.n0), WarpUniform(tile.row_pair)};
}

__device__ __forceinline__ WeightGradClusterTile UniformTile(const WeightGradClusterTile& tile) {
  return {WarpUniform(tile.group), WarpUniform(tile.m0), WarpUniform(tile.n0)};
}

// `unit` in registers the compiler knows to be warp-uniform.
__device__ __forceinline__ TileUnit UniformUnit(const TileUnit& unit) {
  return {WarpUniform(unit.tile),  WarpUniform(unit.piece), WarpUniform(unit.k_begin),
          WarpUniform(unit.k_end), WarpUniform(unit.slot),  WarpUniform(unit.pieces)};
}

// Fills `offsets` (groups + 1) from device memory and tile_prefix (groups + 1) from them: the
// tiles of the groups before g, tiles_of(rows of a group) each; the whole CTA calls it. Traps
// unless 0 = offsets[0] <= ... <= offsets[groups] = rows.
template <typename TilesOf>
__device__ __forceinline__ void BuildTileSchedule(const int32_t* device_offsets, int groups,
                                                  int rows, TilesOf tiles_of, int* offsets,
                                                  int* tile_prefix) {
  for (int i = static_cast<int>(threadIdx.x); i <= groups; i += kThreads) {
    offsets[i] = device_offsets[i];
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    int carry = 0;
    for (int first = 0; first < groups; first += 32) {
      const int g = first + lane;
      int count = 0;
      if (g < groups) {
        if (offsets[g] > offsets[g + 1]) __trap();
        count = tiles_of(offsets[g + 1] - offsets[g]);
      }
      int inclusive = count;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += v;
      }
      if (g < groups) tile_prefix[g + 1] = carry + inclusive;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) {
      if (offsets[0] != 0 || offsets[groups] != rows) __trap();
      tile_prefix[0] = 0;
    }
  }
  __syncthreads();
}

// BuildTileSchedule with the forward's cluster tiles (ClusterTileSchedule).
__device__ __forceinline__ void BuildClusterTileSchedule(const int32_t* device_offsets, int groups,
                                                         int rows, int n_tiles, int* offsets,
                                                         int* tile_prefix) {
  BuildTileSchedule(
      device_offsets, groups, rows,
      [n_tiles](int group_rows) { return ClusterTiles(group_rows, n_tiles); }, offsets,
      tile_prefix);
}

// A consumer's part of a forward cluster tile: its rows [first_row, first_row + valid_rows) and
// columns from `column`; inactive (no wgmma, no output) when its rows lie past the group's end or
// its columns past n.
struct ConsumerTile {
  int first_row, column, valid_rows;
  bool active;

  template <int kTileN>
  __device__ ConsumerTile(const ClusterTileOf<kTileN>& tile, int rank, int consumer, int n)
      : first_row(tile.Row(rank) + 64 * consumer),
        column(tile.Column(rank)),
        valid_rows(min(64, tile.row_end - first_row)),
        active(first_row < tile.row_end && column < n) {}
};

}  // namespace moe::cuda::sm90::detail
