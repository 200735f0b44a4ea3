// The blockwise FP8 recipe's scaling (DeepSeek-V3's; Megatron-LM's --fp8_recipe=blockwise): the
// tile edge, how tensors are cut into tiles and where their scales are stored, and the formula
// that turns a tile's amax into its scale and its quantisation multiplier. The CPU reference and
// the CUDA kernels quantise through this one formula with the same f32 operations, so their e4m3
// values and scales agree bit for bit. constexpr, so device code calls it too (the engine's CUDA
// sources build with --expt-relaxed-constexpr).
#pragma once

#include <cstdint>

#include "engine/core/float8.h"

namespace moe {

// The edge of a tile: activations and gradients are quantised in 1 x 128 tiles along K, weights
// in 128 x 128 blocks. Where a dimension is not a multiple of 128, its last partial tile is a tile
// of its own.
constexpr int64_t kFp8TileSize = 128;
// Tiles along a dimension of `size` elements.
constexpr int64_t Fp8Tiles(int64_t size) { return (size + kFp8TileSize - 1) / kFp8TileSize; }

// `groups` row-major matrices of (rows, cols) one after the other, cut into tiles of tile_rows x
// kFp8TileSize; a matrix's tiles are numbered row-major, which is how its scales are stored
// (groups, tiles along rows, tiles along cols).
struct Fp8TiledMatrices {
  int64_t groups, rows, cols, tile_rows;

  constexpr int64_t elements() const { return rows * cols; }  // of one matrix
  constexpr int64_t row_tiles() const { return (rows + tile_rows - 1) / tile_rows; }
  constexpr int64_t col_tiles() const { return Fp8Tiles(cols); }
  constexpr int64_t tiles() const { return row_tiles() * col_tiles(); }
  // The tile of a matrix's element (r, c).
  constexpr int64_t TileOf(int64_t r, int64_t c) const {
    return r / tile_rows * col_tiles() + c / kFp8TileSize;
  }
  // Where tile `tile` lies among the transposed matrix's tiles (numbered row-major there too).
  constexpr int64_t TransposedTile(int64_t tile) const {
    return tile % col_tiles() * row_tiles() + tile / col_tiles();
  }
};
// The 1 x 128 tiles of an activation or gradient (rows, k).
constexpr Fp8TiledMatrices Fp8RowTiles(int64_t rows, int64_t k) { return {1, rows, k, 1}; }
// The 128 x 128 blocks of stacked weights (groups, n, k).
constexpr Fp8TiledMatrices Fp8Blocks(int64_t groups, int64_t n, int64_t k) {
  return {groups, n, k, kFp8TileSize};
}

// What the FP8 GEMMs' contracted dimension must be a multiple of (e4m3 elements, one byte each):
// the Hopper kernel loads its operand rows with TMA, whose row strides are multiples of 16 bytes.
constexpr int64_t kFp8RowAlignment = 16;

// The weight gradients' operands (ops::QuantizeColumnTiles): grouped rows (rows, k) transposed,
// one f32 scale per tile and column, a group's tiles its rows cut into 128s from its first row
// (so the forward GEMM's row tiles, which start there too, are the same tiles). In the transposed
// rows each group's tokens start at a multiple of kFp8ColumnAlignment, Fp8ColumnStart, and its
// last tile is followed by zeros up to a multiple of kFp8ColumnAlignment: the Hopper weight
// gradient loads a tile with TMA from its first token (a box's start must be 16-byte aligned)
// and multiplies it in 32-token K slices (the e4m3 wgmma's K) without masking. The columns
// between one group's zeros and the next group's start are unspecified.
constexpr int64_t kFp8ColumnAlignment = 32;
// `tokens` rounded up to a multiple of kFp8ColumnAlignment: where a group of that many tokens
// ends with its zeros.
constexpr int64_t Fp8ColumnAligned(int64_t tokens) {
  return (tokens + kFp8ColumnAlignment - 1) / kFp8ColumnAlignment * kFp8ColumnAlignment;
}
// Where group `group`, whose rows start at row `group_begin`, starts in the transposed rows:
// kFp8ColumnAlignment (ceil(group_begin / kFp8ColumnAlignment) + group). Computed from the
// group's own offset, without a scan of the others: consecutive groups never overlap, since
// ceil(end / a) >= ceil(begin / a) + ceil((end - begin) / a) - 1 for a group of rows [begin, end).
constexpr int64_t Fp8ColumnStart(int64_t group, int64_t group_begin) {
  return Fp8ColumnAligned(group_begin) + kFp8ColumnAlignment * group;
}
// The token of that group's row `row` (>= group_begin) in the transposed rows.
constexpr int64_t Fp8ColumnToken(int64_t group, int64_t group_begin, int64_t row) {
  return Fp8ColumnStart(group, group_begin) + row - group_begin;
}
// The transposed rows' length for `groups` groups of `rows` rows in all: the start a group past
// the last would have (a multiple of 32, as TMA's row strides need 16 bytes).
constexpr int64_t Fp8ColumnTokens(int64_t groups, int64_t rows) {
  return Fp8ColumnStart(groups, rows);
}
// A group's rows (empty: begin >= end) or a tile's.
struct Fp8RowRange {
  int64_t begin, end;
};
// Tile t of the group of rows [group_begin, group_end): 128 rows from group_begin + 128 t, or
// the group's rest.
constexpr Fp8RowRange Fp8ColumnTileRows(int64_t group_begin, int64_t group_end, int64_t t) {
  const int64_t begin = group_begin + t * kFp8TileSize;
  return {begin, begin + kFp8TileSize < group_end ? begin + kFp8TileSize : group_end};
}
// The tiles of that group (none if empty).
constexpr int64_t Fp8ColumnTileCount(int64_t group_begin, int64_t group_end) {
  return group_begin < group_end ? Fp8Tiles(group_end - group_begin) : 0;
}
// Where tile t of a group that starts at row `group_begin` keeps its scales: slot group +
// floor(group_begin / 128) + t. The slots of consecutive groups never meet (a group of rows
// [begin, end) has ceil((end - begin) / 128) <= floor(end / 128) - floor(begin / 128) + 1 tiles),
// so their number is bounded by the rows alone, without reading the offsets: Fp8ColumnTileSlots.
constexpr int64_t Fp8ColumnTileSlot(int64_t group, int64_t group_begin, int64_t t) {
  return group + group_begin / kFp8TileSize + t;
}
constexpr int64_t Fp8ColumnTileSlots(int64_t groups, int64_t rows) {
  return groups + Fp8Tiles(rows);
}
// Bytes of QuantizeColumnTiles' forms of (rows, k) grouped rows: e4m3 values and f32 scales.
struct Fp8ColumnTileSizes {
  int64_t values, scales;
};
constexpr Fp8ColumnTileSizes Fp8ColumnTileBytes(int64_t groups, int64_t rows, int64_t k) {
  return {k * Fp8ColumnTokens(groups, rows), 4 * k * Fp8ColumnTileSlots(groups, rows)};
}

// A smaller amax counts as this one, which keeps 448 / amax finite: an all-zero tile gets q = 0
// (dequantised: exact zeros) and a finite, normal scale.
constexpr float kFp8MinAmax = 0x1p-64f;

struct Fp8TileScaling {
  float scale;       // the tile's dequantised values are E4M3ToFloat(q) * scale
  float multiplier;  // q = FloatToE4M3(x * multiplier)
};

// The scaling of a tile whose largest magnitude is `amax` (DeepGEMM's per-token and per-block
// casts, with a floor of kFp8MinAmax where DeepGEMM clamps at 1e-4): a = max(amax, kFp8MinAmax),
// scale = a / 448 and multiplier = 448 / a, each one f32 division rounded to nearest even.
constexpr Fp8TileScaling Fp8ScalingOf(float amax) {
  const float a = amax > kFp8MinAmax ? amax : kFp8MinAmax;
  return {a / kE4M3Max, kE4M3Max / a};
}

}  // namespace moe
