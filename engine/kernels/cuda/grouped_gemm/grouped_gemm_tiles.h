// The tile schedules of the Hopper grouped GEMMs (grouped_gemm_sm90.cuh), in plain C++ so that a
// host test checks them (tests/kernels/grouped_gemm_tiles_test.cc): which part of the output each
// cluster of two CTAs computes, tile by tile.
//
// Forward (and data gradient):
// Groups own the token rows [offsets[g], offsets[g + 1]) of y (rows, n). y is cut into kBlockM x
// N tiles (N: the kernel's tile width, kTileN; the bf16 kernels' kBlockN, the FP8 forward's 192)
// that never cross a group's end, and a cluster tile is two of them, one per CTA rank r. A row
// pair stacks them along M (rows row0 + kBlockM r, columns n0): the CTAs share w's tile of those
// N output columns, each loads half and multicasts it. A column pair puts them side by side
// (rows row0, columns n0 + N r): they share x's kBlockM rows. A group with c =
// ceil(rows_g / kBlockM) row tiles has c / 2 row pairs per column tile and, when c is odd, its last
// row tile in column pairs (a column tile past n leaves its CTA's consumers idle). Order:
// group-major; within a group the row pairs of a column tile consecutive (the clusters resident
// together read one weight tile from L2), then the column pairs. (Each column pair right after the
// row pairs of its two column tiles instead, so that it reads their weight tiles from L2, was no
// faster overall: not kept.)
//
// Weight gradient: dw_g (n, k) = dy_g^T x_g is cut into kBlockM x N tiles (N: the bf16 kernel's
// kBlockN, the FP8 kernel's 192), and a cluster tile is two of them stacked along M (dw rows m0 +
// kBlockM r, columns n0): the CTAs share x_g's N columns, each loads its part and multicasts it.
// With an odd number of row tiles the last pair's second tile lies past n (its CTA's consumers
// idle). Order: group-major; within a group, bands of band_pairs row pairs, and within a band
// column-major (a band's row pairs over one column tile consecutive). Where dy_g outgrows L2, one
// band (all row pairs) would sweep all of dy_g once per column tile, reading it from DRAM again
// each time (many times the operands' bytes); bands of kWeightGradBandPairs keep the clusters
// resident together on a few of dy_g's columns and a few of x_g's column tiles, which stay in L2
// while the band sweeps x_g's columns. Where dy_g fits, one band reads each operand once. The
// launcher decides by the average group's dy_g (a skewed routing's largest group may outgrow L2
// where the average does not).
#pragma once

#include <cstdint>

#include "engine/kernels/fp8_scaling.h"

#if defined(__CUDACC__)
#define MOE_HOST_DEVICE __host__ __device__
#else
#define MOE_HOST_DEVICE
#endif

namespace moe::cuda::sm90 {

constexpr int kBlockM = 128;  // C rows per tile: 64 per consumer warpgroup
constexpr int kBlockN = 256;  // C columns per tile: one m64n256k16 per consumer and K slice
constexpr int kShortRowTile = kBlockM / 2;  // rows of one consumer warpgroup

// Whether a group of `rows` rows ends in a short row tile, one of at most kShortRowTile rows: a
// single consumer's, the other idling beside it (the tile costs about a full one's time).
MOE_HOST_DEVICE inline bool EndsInShortRowTile(int64_t rows) {
  return rows % kBlockM != 0 && rows % kBlockM <= kShortRowTile;
}

// A cluster tile of kBlockM x kTileN tiles.
template <int kTileN>
struct ClusterTileOf {
  int group;
  int row0, row_end;  // the cluster's first row; the group's end
  int n0;             // the cluster's first column
  int row_pair;       // 1: row pair, 0: column pair

  // The first row and column of rank `rank`'s tile.
  MOE_HOST_DEVICE int Row(int rank) const { return row_pair ? row0 + kBlockM * rank : row0; }
  MOE_HOST_DEVICE int Column(int rank) const { return row_pair ? n0 : n0 + kTileN * rank; }
};
using ClusterTile = ClusterTileOf<kBlockN>;

// Cluster tiles of a group of `rows` rows, with n_tiles column tiles.
MOE_HOST_DEVICE inline int ClusterTiles(int rows, int n_tiles) {
  const int row_tiles = (rows + kBlockM - 1) / kBlockM;
  return row_tiles / 2 * n_tiles + row_tiles % 2 * ((n_tiles + 1) / 2);
}

// The group of tile t, given tile_prefix (groups + 1: the tiles of the groups before each): the
// last group g with tile_prefix[g] <= t (an empty group never is: the next one has the same
// prefix).
MOE_HOST_DEVICE inline int GroupOfTile(const int* tile_prefix, int groups, int t) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_prefix[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Over the offsets (groups + 1) and tile_prefix (groups + 1): cluster tiles of the groups before
// g, tile_prefix[groups] in all; tiles kTileN columns wide.
template <int kTileN>
struct ClusterTileScheduleOf {
  const int* offsets;
  const int* tile_prefix;
  int groups;
  int n_tiles;  // kTileN-column tiles of y

  MOE_HOST_DEVICE int Total() const { return tile_prefix[groups]; }

  // Tile t of Total(), in the order above.
  MOE_HOST_DEVICE ClusterTileOf<kTileN> Find(int t) const {
    const int lo = GroupOfTile(tile_prefix, groups, t);
    const int begin = offsets[lo], end = offsets[lo + 1];
    const int row_tiles = (end - begin + kBlockM - 1) / kBlockM;
    const int row_pairs = row_tiles / 2;
    const int local = t - tile_prefix[lo];
    if (local < row_pairs * n_tiles) {
      return {lo, begin + local % row_pairs * 2 * kBlockM, end, local / row_pairs * kTileN, 1};
    }
    const int column_pair = local - row_pairs * n_tiles;
    return {lo, begin + (row_tiles - 1) * kBlockM, end, column_pair * 2 * kTileN, 0};
  }
};
using ClusterTileSchedule = ClusterTileScheduleOf<kBlockN>;

// The last, partial wave of a plain product's cluster tiles split along K (a stream-K tail; the
// SwiGLU kernels keep every tile whole). With T cluster tiles on C clusters taken round-robin, the
// last R = T mod C tiles leave C - R clusters idle for a whole tile's time (Mixtral-8x7B's fc2 at
// 4096 tokens: 544 tiles, 8 rounds and 16 tiles on 66 clusters). Each of those R tiles is cut
// into S = C / R pieces of its k-blocks (at least kMinPieceKBlocks each): pieces 1 .. S - 1 write
// their partial accumulators to a workspace and flag them written; piece 0 adds them to its own
// and runs the tile's epilogue. Units in order: the writer pieces first (so that they are done
// long before piece 0 waits for them, on every cluster that holds one), then the whole tiles, then
// the pieces 0. S = 1 (no split) where R = 0, where C / R < 2, or where the writer pieces would
// outnumber the workspace's slots.
constexpr int kMinPieceKBlocks = 8;

struct TileUnit {
  int tile;            // cluster tile (ClusterTileSchedule::Find)
  int piece;           // 0: the tile's epilogue (after the other pieces' partials, if any)
  int k_begin, k_end;  // k-blocks [k_begin, k_end)
  int slot;            // piece > 0: its workspace slot; piece 0: the tile's first slot
  int pieces;          // of this tile: 1 (whole) or S

  MOE_HOST_DEVICE bool WritesPartial() const { return piece > 0; }
  MOE_HOST_DEVICE bool AddsPartials() const { return piece == 0 && pieces > 1; }
};

struct TailSplit {
  int whole;     // tiles run whole: [0, whole)
  int tail;      // split tiles: [whole, whole + tail)
  int pieces;    // per split tile (>= 2 when tail > 0)
  int k_blocks;  // of every tile

  // T tiles of k_blocks each on `clusters` clusters, with `slots` workspace slots.
  MOE_HOST_DEVICE static TailSplit Of(int tiles, int clusters, int k_blocks, int slots) {
    const int tail = tiles % clusters;
    int pieces = tail > 0 ? clusters / tail : 1;
    if (pieces > k_blocks / kMinPieceKBlocks) pieces = k_blocks / kMinPieceKBlocks;
    if (pieces < 2 || tail * (pieces - 1) > slots) return Whole(tiles, k_blocks);
    return {tiles - tail, tail, pieces, k_blocks};
  }
  // Every tile whole.
  MOE_HOST_DEVICE static TailSplit Whole(int tiles, int k_blocks) {
    return {tiles, 0, 1, k_blocks};
  }
  MOE_HOST_DEVICE int Writers() const { return tail * (pieces - 1); }
  MOE_HOST_DEVICE int Units() const { return whole + tail * pieces; }

  // Unit u of Units(), in the order above.
  MOE_HOST_DEVICE TileUnit Find(int u) const {
    const int writers = Writers();
    if (u < writers) {
      const int j = u / (pieces - 1), piece = 1 + u % (pieces - 1);
      return {whole + j, piece, KBegin(piece), KBegin(piece + 1), u, pieces};
    }
    if (u < writers + whole) return {u - writers, 0, 0, k_blocks, 0, 1};
    const int j = u - writers - whole;
    return {whole + j, 0, 0, KBegin(1), j * (pieces - 1), pieces};
  }

 private:
  MOE_HOST_DEVICE int KBegin(int piece) const {
    return static_cast<int>(static_cast<int64_t>(piece) * k_blocks / pieces);
  }
};

constexpr int kWeightGradBandPairs = 8;
// Bands above this many bytes of the average group's dy_g (rows_g x n).
constexpr int64_t kWeightGradBandDyBytes = int64_t{16} << 20;

struct WeightGradClusterTile {
  int group;
  int m0;  // the cluster's first dw row (of n)
  int n0;  // its first dw column (of k)

  // The first dw row of rank `rank`'s tile.
  MOE_HOST_DEVICE int Row(int rank) const { return m0 + kBlockM * rank; }
};

// Over groups of dw (n, k) each: m_pairs row pairs and n_tiles column tiles of kTileN columns per
// group, the operands kElementBytes an element (the bf16 kernel's 256 columns of 2 bytes, the FP8
// kernel's 192 of 1).
template <int kTileN, int kElementBytes>
struct WeightGradClusterScheduleOf {
  int m_pairs;     // ceil(ceil(n / kBlockM) / 2)
  int n_tiles;     // ceil(k / kTileN)
  int band_pairs;  // 1 <= band_pairs <= m_pairs

  // dw (n, k), n and k in [1, 2^31), in bands of band_pairs (clamped to [1, m_pairs]).
  static WeightGradClusterScheduleOf WithBands(int64_t n, int64_t k, int band_pairs) {
    const int m_pairs = static_cast<int>(((n - 1) / kBlockM + 2) / 2);
    const int clamped = band_pairs < 1 ? 1 : (band_pairs > m_pairs ? m_pairs : band_pairs);
    return {m_pairs, static_cast<int>((k - 1) / kTileN + 1), clamped};
  }

  // The schedule of `groups` >= 1 groups that hold `rows` token rows in all: bands of
  // kWeightGradBandPairs where the average group's dy_g outgrows kWeightGradBandDyBytes, else one.
  static WeightGradClusterScheduleOf Of(int64_t n, int64_t k, int64_t rows, int groups) {
    WeightGradClusterScheduleOf schedule = WithBands(n, k, kWeightGradBandPairs);
    if (rows / groups * n * kElementBytes <= kWeightGradBandDyBytes) {
      schedule.band_pairs = schedule.m_pairs;
    }
    return schedule;
  }
  MOE_HOST_DEVICE int PerGroup() const { return m_pairs * n_tiles; }

  // Tile t of groups * PerGroup(), in the order above.
  MOE_HOST_DEVICE WeightGradClusterTile Find(int t) const {
    const int group = t / PerGroup();
    const int local = t % PerGroup();
    const int band_tiles = band_pairs * n_tiles;
    const int first_pair = local / band_tiles * band_pairs;
    const int pairs = m_pairs - first_pair < band_pairs ? m_pairs - first_pair : band_pairs;
    const int in_band = local % band_tiles;
    return {group, (first_pair + in_band % pairs) * 2 * kBlockM, in_band / pairs * kTileN};
  }
};
using WeightGradClusterSchedule = WeightGradClusterScheduleOf<kBlockN, 2>;

// Whether the FP8 weight gradient of `rows` token rows in all parts over `groups` groups takes its
// clustered kernel (128 x 192 tiles in pairs sharing x's columns) rather than the unclustered one
// (128 x 128): where the average group holds more than 8 token tiles (of kFp8TileSize tokens),
// whose operand traffic through L2, which the clustered tiles cut, outweighs a tile's output
// writes, which the unclustered kernel stages at once.
inline bool Fp8WeightGradUsesClusters(int64_t rows, int groups) {
  return rows > 8 * kFp8TileSize * groups;
}

}  // namespace moe::cuda::sm90
