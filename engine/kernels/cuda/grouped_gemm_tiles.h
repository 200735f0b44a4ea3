// The forward tile schedule of the Hopper grouped GEMMs (grouped_gemm_sm90.cuh), in plain C++ so
// that a host test checks it (tests/kernels/grouped_gemm_tiles_test.cc): which part of y each
// cluster of two CTAs computes, tile by tile.
//
// Groups own the token rows [offsets[g], offsets[g + 1]) of y (rows, n). y is cut into kBlockM x
// kBlockN tiles that never cross a group's end, and a cluster tile is two of them, one per CTA
// rank r. A row pair stacks them along M (rows row0 + kBlockM r, columns n0): the CTAs share w's
// tile of those kBlockN output columns, each loads half and multicasts it. A column pair puts them
// side by side (rows row0, columns n0 + kBlockN r): they share x's kBlockM rows. A group with c =
// ceil(rows_g / kBlockM) row tiles has c / 2 row pairs per column tile and, when c is odd, its last
// row tile in column pairs (a column tile past n leaves its CTA's consumers idle). Order:
// group-major; within a group the row pairs of a column tile consecutive (the clusters resident
// together read one weight tile from L2), then the column pairs.
#pragma once

#if defined(__CUDACC__)
#define MOE_HOST_DEVICE __host__ __device__
#else
#define MOE_HOST_DEVICE
#endif

namespace moe::cuda::sm90 {

constexpr int kBlockM = 128;  // C rows per tile: 64 per consumer warpgroup
constexpr int kBlockN = 256;  // C columns per tile: one m64n256k16 per consumer and K slice

struct ClusterTile {
  int group;
  int row0, row_end;  // the cluster's first row; the group's end
  int n0;             // the cluster's first column
  int row_pair;       // 1: row pair, 0: column pair

  // The first row and column of rank `rank`'s tile.
  MOE_HOST_DEVICE int Row(int rank) const { return row_pair ? row0 + kBlockM * rank : row0; }
  MOE_HOST_DEVICE int Column(int rank) const { return row_pair ? n0 : n0 + kBlockN * rank; }
};

// Cluster tiles of a group of `rows` rows, with n_tiles column tiles.
MOE_HOST_DEVICE inline int ClusterTiles(int rows, int n_tiles) {
  const int row_tiles = (rows + kBlockM - 1) / kBlockM;
  return row_tiles / 2 * n_tiles + row_tiles % 2 * ((n_tiles + 1) / 2);
}

// Over the offsets (groups + 1) and tile_prefix (groups + 1): cluster tiles of the groups before
// g, tile_prefix[groups] in all.
struct ClusterTileSchedule {
  const int* offsets;
  const int* tile_prefix;
  int groups;
  int n_tiles;  // kBlockN-column tiles of y

  MOE_HOST_DEVICE int Total() const { return tile_prefix[groups]; }

  // Tile t of Total(), in the order above. g is the last group with tile_prefix[g] <= t (an
  // empty group never is: the next one has the same prefix).
  MOE_HOST_DEVICE ClusterTile Find(int t) const {
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tile_prefix[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int begin = offsets[lo], end = offsets[lo + 1];
    const int row_tiles = (end - begin + kBlockM - 1) / kBlockM;
    const int row_pairs = row_tiles / 2;
    const int local = t - tile_prefix[lo];
    if (local < row_pairs * n_tiles) {
      return {lo, begin + local % row_pairs * 2 * kBlockM, end, local / row_pairs * kBlockN, 1};
    }
    const int column_pair = local - row_pairs * n_tiles;
    return {lo, begin + (row_tiles - 1) * kBlockM, end, column_pair * 2 * kBlockN, 0};
  }
};

}  // namespace moe::cuda::sm90
