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
// one f32 scale per tile and column, a group's tiles its rows in each 128-row window [128 j,
// 128 (j + 1)) of all the rows (so every tile's first transposed column, and every TMA box the
// Hopper kernel loads, starts at a multiple of 128 or at the group's first row, and the kernel
// loads whole windows). The transposed rows are padded to a multiple of kFp8RowAlignment (TMA's
// strides).
constexpr int64_t Fp8PaddedRows(int64_t rows) {
  return (rows + kFp8RowAlignment - 1) / kFp8RowAlignment * kFp8RowAlignment;
}
// Tile t of the group of rows [group_begin, group_end): its rows in window floor(group_begin /
// 128) + t; empty (begin >= end) past the group's last tile.
struct Fp8RowRange {
  int64_t begin, end;
};
constexpr Fp8RowRange Fp8ColumnTileRows(int64_t group_begin, int64_t group_end, int64_t t) {
  const int64_t window = (group_begin / kFp8TileSize + t) * kFp8TileSize;
  return {window > group_begin ? window : group_begin,
          window + kFp8TileSize < group_end ? window + kFp8TileSize : group_end};
}
// The tiles of that group: the windows from its first row's to its last row's (none if empty).
constexpr int64_t Fp8ColumnTileCount(int64_t group_begin, int64_t group_end) {
  return group_begin < group_end ? (group_end - 1) / kFp8TileSize - group_begin / kFp8TileSize + 1
                                 : 0;
}
// Where tile t of a group that starts at row `group_begin` keeps its scales: slot group +
// floor(group_begin / 128) + t, i.e. the group's index plus its tile's window. A group's last
// tile lies in the window of its last row, and the next group's first tile in that window or a
// later one, so the slots of consecutive groups never meet and their number is bounded by the
// rows alone, without reading the offsets: Fp8ColumnTileSlots.
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
  return {k * Fp8PaddedRows(rows), 4 * k * Fp8ColumnTileSlots(groups, rows)};
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
