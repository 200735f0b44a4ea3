// The Hopper grouped GEMMs' forward tile schedule (engine/kernels/cuda/grouped_gemm_tiles.h), on
// the host: over group sizes that hit every case (empty groups, one row, a tile's edges, odd and
// even row-tile counts) and column counts (one column tile, odd and even counts, a tail), the
// cluster tiles cover every kBlockM x kBlockN tile of y that holds rows exactly once, by a tile
// that lies inside its group's rows, and only a column pair's tile past n is left idle.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>
#include <vector>

#include "engine/kernels/cuda/grouped_gemm_tiles.h"

namespace moe {
namespace {

using cuda::sm90::ClusterTile;
using cuda::sm90::ClusterTiles;
using cuda::sm90::ClusterTileSchedule;
using cuda::sm90::kBlockM;
using cuda::sm90::kBlockN;

// Checks the schedule of groups with these row counts over n columns.
void ExpectEveryTileOnce(const std::vector<int>& group_rows, int n) {
  const int groups = static_cast<int>(group_rows.size());
  const int n_tiles = (n + kBlockN - 1) / kBlockN;
  std::vector<int> offsets{0}, tile_prefix{0};
  for (int rows : group_rows) {
    offsets.push_back(offsets.back() + rows);
    tile_prefix.push_back(tile_prefix.back() + ClusterTiles(rows, n_tiles));
  }
  const ClusterTileSchedule schedule{offsets.data(), tile_prefix.data(), groups, n_tiles};
  std::map<std::pair<int, int>, int> owner;  // (first row, first column) -> group
  int idle = 0;
  for (int t = 0; t < schedule.Total(); ++t) {
    const ClusterTile tile = schedule.Find(t);
    ASSERT_GE(tile.group, 0);
    ASSERT_LT(tile.group, groups);
    EXPECT_EQ(tile.row_end, offsets[tile.group + 1]) << "tile " << t;
    for (int rank = 0; rank < 2; ++rank) {
      const int row = tile.Row(rank), column = tile.Column(rank);
      EXPECT_GE(row, offsets[tile.group]) << "tile " << t << " rank " << rank;
      EXPECT_EQ((row - offsets[tile.group]) % kBlockM, 0) << "tile " << t << " rank " << rank;
      EXPECT_EQ(column % kBlockN, 0) << "tile " << t << " rank " << rank;
      if (row >= tile.row_end || column >= n) {  // nothing to compute: only a column pair's
        EXPECT_FALSE(tile.row_pair) << "tile " << t << " rank " << rank;  // second tile past n
        EXPECT_EQ(rank, 1) << "tile " << t;
        EXPECT_LT(row, tile.row_end) << "tile " << t;
        ++idle;
        continue;
      }
      EXPECT_TRUE(owner.emplace(std::make_pair(row, column), tile.group).second)
          << "rows from " << row << ", columns from " << column << " computed twice";
    }
  }
  int expected_tiles = 0, odd_groups = 0;
  for (int g = 0; g < groups; ++g) {
    const int row_tiles = (group_rows[g] + kBlockM - 1) / kBlockM;
    expected_tiles += row_tiles * n_tiles;
    odd_groups += row_tiles % 2;
    for (int r = 0; r < row_tiles; ++r) {
      for (int c = 0; c < n_tiles; ++c) {
        const auto it = owner.find({offsets[g] + r * kBlockM, c * kBlockN});
        ASSERT_NE(it, owner.end())
            << "group " << g << " row tile " << r << " column tile " << c << " never computed";
        EXPECT_EQ(it->second, g);
      }
    }
  }
  EXPECT_EQ(static_cast<int>(owner.size()), expected_tiles);
  EXPECT_EQ(idle, odd_groups * (n_tiles % 2)) << "an odd row tile's last column pair only";
}

TEST(GroupedGemmTilesTest, HandPickedGroups) {
  // Empty groups first, last and in between; a tile's edges; odd and even row-tile counts.
  const std::vector<int> rows = {0, 1, 127, 128, 129, 255, 256, 257, 0, 0, 384, 385, 640, 0};
  for (int n : {8, 256, 264, 512, 688, 1000, 1536, 2048, 4096}) {
    SCOPED_TRACE(n);
    ExpectEveryTileOnce(rows, n);
  }
  ExpectEveryTileOnce({32768}, 1536);   // every row on one expert
  ExpectEveryTileOnce({0, 0, 5}, 256);  // one group with rows, after empty ones
}

TEST(GroupedGemmTilesTest, RandomGroups) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> group_count(1, 40), rows(0, 700), columns(1, 40);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> group_rows(group_count(random));
    for (int& r : group_rows) r = random() % 4 == 0 ? 0 : rows(random);
    const int n = 8 * columns(random) * (random() % 2 == 0 ? 1 : 16);
    SCOPED_TRACE(trial);
    ExpectEveryTileOnce(group_rows, n);
  }
}

}  // namespace
}  // namespace moe
