// The pieces of the FP8 kernels that quantise a tile of at most kFp8TileSize x kFp8TileSize
// elements with one block of kTileThreads threads (include only from .cu files):
//   TileSlice / LoadTile: the tile in the block's registers, warp w holding the tile's rows
//     w + kTileWarps * i (wherever each row lies, or computed as it is read: a gather reads in
//     place, SwiGLU's output is never stored), lane l their columns l + 32 j: every load of a
//     warp reads 32 consecutive elements of a row; elements outside the tile read as 0 (no amax
//     changes).
//   StoreQuantizedRow: one row's quantised bytes, 32 consecutive bytes a store.
//   StagedTile / StageTransposed / StoreTransposed: the quantised tile transposed through shared
//     memory, so that a warp stores 32 consecutive bytes of a transposed row at a time. A staged
//     row is an odd number of 4-byte words long, so the lanes of a warp, each staging a column
//     of the same row, hit 32 different banks.
// Quantisation is ToE4M3(x * multiplier): one f32 multiplication, then the device's
// cvt.rn.satfinite e4m3 (what FloatToE4M3 emulates on the host).
#pragma once

#include <cuda_fp8.h>

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda {

constexpr int kTileWarps = 8;
constexpr int kTileThreads = 32 * kTileWarps;
constexpr int kTileRowsPerWarp = kFp8TileSize / kTileWarps;
constexpr int kTileColsPerLane = kFp8TileSize / 32;
static_assert(kFp8TileSize % kTileWarps == 0 && kFp8TileSize % 32 == 0, "whole slices");
static_assert(kTileThreads >= kFp8TileSize, "a thread per column of a tile");

__device__ __forceinline__ __nv_fp8_storage_t ToE4M3(float value) {
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
}

// A thread's elements of a tile: v[i][j] is element (warp + kTileWarps * i, lane + 32 * j).
struct TileSlice {
  float v[kTileRowsPerWarp][kTileColsPerLane];
};

// The tile of `rows` x `cols` elements (each at most kFp8TileSize) as f32: element (r, c) is
// row_of(r)(c) (row_of is called for r < rows only, the row it returns for c < cols only);
// elements past rows or cols are 0.
template <typename RowOf>
__device__ __forceinline__ void LoadTile(RowOf row_of, int rows, int cols, TileSlice& slice) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kTileRowsPerWarp; ++i) {
    const int r = warp + kTileWarps * i;  // warp-uniform
    if (r >= rows) {
#pragma unroll
      for (int j = 0; j < kTileColsPerLane; ++j) slice.v[i][j] = 0.0f;
      continue;
    }
    const auto row = row_of(r);
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) {
      const int c = lane + 32 * j;
      slice.v[i][j] = c < cols ? row(c) : 0.0f;
    }
  }
}

// A row's elements from `first` on, as f32.
template <typename T>
__device__ __forceinline__ auto RowReader(const T* first) {
  return [first](int c) { return ToFloat(first[c]); };
}

// The largest magnitude of the lane's elements of slice row i (0 if none; NaN skipped).
__device__ __forceinline__ float LaneRowAmax(const TileSlice& slice, int i) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kTileColsPerLane; ++j) amax = fmaxf(amax, fabsf(slice.v[i][j]));
  return amax;
}

// out[c] = ToE4M3(v[c] * multiplier) for the row's columns c < cols held by the calling lane
// (v: a row of a TileSlice); a warp stores the whole row.
__device__ __forceinline__ void StoreQuantizedRow(const float (&v)[kTileColsPerLane],
                                                  float multiplier, int cols,
                                                  __nv_fp8_storage_t* out) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kTileColsPerLane; ++j) {
    const int c = lane + 32 * j;
    if (c < cols) out[c] = ToE4M3(v[j] * multiplier);
  }
}

// A quantised tile transposed: staged[c][r] is element (r, c).
constexpr int kStagedRowBytes = kFp8TileSize + 4;
static_assert(kStagedRowBytes % 8 == 4, "a staged row is an odd number of 4-byte words");
using StagedTile = __nv_fp8_storage_t[kFp8TileSize][kStagedRowBytes];

// staged[c][r] = ToE4M3(element (r, c) * multiplier(c)) for every element of the slice (those
// outside the tile too: zeros, never stored). Synchronise before reading `staged`.
template <typename Multiplier>
__device__ __forceinline__ void StageTransposed(const TileSlice& slice, Multiplier multiplier,
                                                StagedTile& staged) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kTileColsPerLane; ++j) {
    const int c = lane + 32 * j;
    const float m = multiplier(c);
#pragma unroll
    for (int i = 0; i < kTileRowsPerWarp; ++i) {
      staged[c][warp + kTileWarps * i] = ToE4M3(slice.v[i][j] * m);
    }
  }
}

// For each column c < cols of the staged tile: out[c * ld + r] = staged[c][r] for r < rows, and
// 0 for rows <= r < width (padding past the tile); a warp per column at a time.
__device__ __forceinline__ void StoreTransposed(const StagedTile& staged, int rows, int cols,
                                                int width, __nv_fp8_storage_t* out, int64_t ld) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int c = warp; c < cols; c += kTileWarps) {
    for (int r = lane; r < width; r += 32) {
      out[c * ld + r] = r < rows ? staged[c][r] : __nv_fp8_storage_t{0};
    }
  }
}

}  // namespace moe::cuda
