// The weight gradient's reduction dimension in the Hopper grouped GEMMs (design:
// ../grouped_gemm_sm90.cuh): a group's token rows in up to kMaxWeightGradParts parts, walked in
// 64-row K steps; which 16-row slices of a part's last step the consumers read, and the producer's
// zeroing of the rows past the group's end in them; and a part as the launcher takes it. (The FP8
// weight gradient walks its parts' rows in 128-token tiles of its own: ForEachTokenTile.)
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"

namespace moe::cuda::sm90 {

// The token rows of one weight-gradient launch, in up to kMaxWeightGradParts parts (say the
// micro-batches whose gradients it sums), each with its own dy, x and offsets: a kernel parameter
// (__grid_constant__), so the tensor maps stay in parameter space, where TMA reads them.
struct WeightGradParts {
  CUtensorMap dy[kMaxWeightGradParts];  // dy_p as (n, rows_p), box (64, 64)
  CUtensorMap x[kMaxWeightGradParts];   // x_p as (k, rows_p), box (64, 64)
  const int32_t* offsets[kMaxWeightGradParts];
  int rows[kMaxWeightGradParts];
  int count;  // 1 <= count <= kMaxWeightGradParts, each part with rows
};

// One part of a weight gradient's token rows: dy (rows, n) and x (rows, k) bf16, offsets (groups +
// 1) int32 in device memory.
struct WeightGradRows {
  const bf16* dy;
  const bf16* x;
  const int32_t* offsets;
  int64_t rows;
};

namespace detail {

// Part p's token rows of `group`, [begin, end). Traps on offsets outside 0 <= offsets[g] <=
// offsets[g + 1] <= rows.
struct RowRange {
  int begin, end;
};
__device__ __forceinline__ RowRange PartRows(const WeightGradParts& parts, int p, int group) {
  const int32_t* offsets = parts.offsets[p];
  const int begin = offsets[group], end = offsets[group + 1];
  if (begin < 0 || begin > end || end > parts.rows[p]) __trap();
  return {begin, end};
}

// The rows of a stage holding `valid` K rows that the consumers read: its 16-row K slices with
// rows.
__device__ __forceinline__ int ReadRows(int valid) {
  return (valid + kWgmmaK - 1) / kWgmmaK * kWgmmaK;
}

// The 16-row K slices with rows in each 64-row stage of a weight-gradient tile of `group`, called
// once per stage in order (the consumers' stage_slices): every part's stages are whole but its
// last, which ends with the part's rows; the consumers skip the slices after that.
struct PartSlices {
  const WeightGradParts& parts;
  int group;
  int part = -1;
  int rows_left = 0;  // in `part`, from the next stage on

  __device__ int operator()() {
    while (rows_left == 0) {
      ++part;
      const RowRange range = PartRows(parts, part, group);
      rows_left = range.end - range.begin;
    }
    const int rows = min(kBlockK, rows_left);
    rows_left -= rows;
    return WarpUniform(ReadRows(rows) / kWgmmaK);
  }
};

// Zeroes the 128-byte lines of rows [valid, ReadRows(valid)) of the stage's six 64-row boxes (A:
// 2, B: 4): the K rows past the group's end that the consumers read (the slices after them they
// skip); the producer warp calls it (all lanes).
__device__ __forceinline__ void ZeroRowsPastEnd(uint8_t* a, uint8_t* b, int valid) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int line = valid + lane / 8; line < ReadRows(valid); line += 4) {
    const int offset = line * kSwizzleRowBytes + lane % 8 * 16;
#pragma unroll
    for (int box = 0; box < kBlockM / 64; ++box) {
      *reinterpret_cast<uint4*>(a + box * kBoxBytes + offset) = zero;
    }
#pragma unroll
    for (int box = 0; box < kBlockN / 64; ++box) {
      *reinterpret_cast<uint4*>(b + box * kBoxBytes + offset) = zero;
    }
  }
}

}  // namespace detail

}  // namespace moe::cuda::sm90
