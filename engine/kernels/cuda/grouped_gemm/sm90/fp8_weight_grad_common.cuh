// What the Hopper FP8 grouped weight gradient's two kernels share (design:
// ../fp8_grouped_gemm_sm90.cuh): the parts of a launch, a group's token tiles (one stage each) and
// the promotion of a stage's products. The kernels: 128 x 128 dw tiles, a CTA alone
// (fp8_weight_grad_kernel.cuh), and 128 x 192 tiles in clusters of two sharing x's columns
// (fp8_weight_grad_cluster_kernel.cuh); grouped_gemm_tiles.h's Fp8WeightGradUsesClusters chooses.
#pragma once

#include <cstdint>

#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/fp8_mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_parts.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda::sm90 {

static_assert(kFp8ColumnAlignment % kFp8WgmmaK == 0, "a group's last K slice ends in its zeros");

// The rows of x_q's TMA box: a tile's 128 columns at once, or the clustered tiles' 64-row pieces.
inline int Fp8WeightGradXBoxRows(bool clustered) { return clustered ? kFp8BoxRows : kFp8BlockN; }

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
// (kFp8BlockK, 128), and x_q as (stride, k), box (kFp8BlockK, Fp8WeightGradXBoxRows(clustered)),
// uint8; the scales of each part beside them.
struct Fp8WeightGradParts {
  WeightGradParts tokens;
  const float* dy_scales[kMaxWeightGradParts];
  const float* x_scales[kMaxWeightGradParts];
};

namespace detail {

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

// The promotion of one stage's products: acc = fma(part, dy_scale[row] * x_scale[column], acc)
// for this thread's rows `row` and row + 8 of its consumer's (in the CTA's 128) and its
// kAccumulators / 4 column pairs (FragmentPosition), from the stage's scales: kFp8BlockM of dy
// (the CTA tile's dw rows), then x's (its columns).
template <int kAccumulators>
__device__ __forceinline__ void PromoteFp8WeightGradStage(float (&acc)[kAccumulators],
                                                          const float (&part)[kAccumulators],
                                                          const float* scales, int row,
                                                          const FragmentPosition& at) {
  const float dy_scale[2] = {scales[row], scales[row + 8]};
  // Register 4 i + 2 h + j holds row Row() + 8 h, column 8 i + Column() + j.
#pragma unroll
  for (int i = 0; i < kAccumulators / 4; ++i) {
    const float2 x_scale =
        *reinterpret_cast<const float2*>(scales + kFp8BlockM + 8 * i + at.Column());
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      acc[4 * i + 2 * h] = fmaf(part[4 * i + 2 * h], dy_scale[h] * x_scale.x, acc[4 * i + 2 * h]);
      acc[4 * i + 2 * h + 1] =
          fmaf(part[4 * i + 2 * h + 1], dy_scale[h] * x_scale.y, acc[4 * i + 2 * h + 1]);
    }
  }
}

}  // namespace detail

}  // namespace moe::cuda::sm90
