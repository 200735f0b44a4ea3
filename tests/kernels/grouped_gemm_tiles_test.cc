// The Hopper grouped GEMMs' tile schedules (engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h),
// on the host. Forward: over group sizes that hit every case (empty groups, one row, a tile's
// edges, odd and even row-tile counts) and column counts (one column tile, odd and even counts, a
// tail), the cluster tiles cover every kBlockM x N tile of y that holds rows exactly once (N the
// bf16 kernels' kBlockN and the FP8 forward's 192), by a tile that lies inside its group's rows,
// and only a column pair's tile past n is left idle.
// Weight gradient (the bf16 kernel's kBlockN columns of 2 bytes and the FP8 kernel's 192 of 1):
// over dw sizes with odd and even row-tile counts, bands that divide the row pairs or leave a
// partial band, and tails, the cluster tiles cover every tile of every group's dw exactly once, and
// only the second tile of a group's last pair, past n when the row tiles are odd, idles; bands are
// chosen only where a group's dy outgrows L2.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"

namespace moe {
namespace {

using cuda::sm90::ClusterTileOf;
using cuda::sm90::ClusterTiles;
using cuda::sm90::ClusterTileScheduleOf;
using cuda::sm90::kBlockM;
using cuda::sm90::kBlockN;
using cuda::sm90::TailSplit;
using cuda::sm90::TileUnit;
using cuda::sm90::WeightGradClusterSchedule;
using cuda::sm90::WeightGradClusterScheduleOf;
using cuda::sm90::WeightGradClusterTile;

// The FP8 forward's and weight gradient's tiles (fp8_mainloop.cuh's kFp8ForwardTileN and
// kFp8WeightGradTileN; that header needs CUDA's).
constexpr int kFp8TileN = 192;
using Fp8WeightGradSchedule = WeightGradClusterScheduleOf<kFp8TileN, 1>;

// Checks the schedule of groups with these row counts over n columns, in tiles kTileN wide.
template <int kTileN>
void ExpectEveryTileOnce(const std::vector<int>& group_rows, int n) {
  const int groups = static_cast<int>(group_rows.size());
  const int n_tiles = (n + kTileN - 1) / kTileN;
  std::vector<int> offsets{0}, tile_prefix{0};
  for (int rows : group_rows) {
    offsets.push_back(offsets.back() + rows);
    tile_prefix.push_back(tile_prefix.back() + ClusterTiles(rows, n_tiles));
  }
  const ClusterTileScheduleOf<kTileN> schedule{offsets.data(), tile_prefix.data(), groups, n_tiles};
  std::map<std::pair<int, int>, int> owner;  // (first row, first column) -> group
  int idle = 0;
  for (int t = 0; t < schedule.Total(); ++t) {
    const ClusterTileOf<kTileN> tile = schedule.Find(t);
    ASSERT_GE(tile.group, 0);
    ASSERT_LT(tile.group, groups);
    EXPECT_EQ(tile.row_end, offsets[tile.group + 1]) << "tile " << t;
    for (int rank = 0; rank < 2; ++rank) {
      const int row = tile.Row(rank), column = tile.Column(rank);
      EXPECT_GE(row, offsets[tile.group]) << "tile " << t << " rank " << rank;
      EXPECT_EQ((row - offsets[tile.group]) % kBlockM, 0) << "tile " << t << " rank " << rank;
      EXPECT_EQ(column % kTileN, 0) << "tile " << t << " rank " << rank;
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
        const auto it = owner.find({offsets[g] + r * kBlockM, c * kTileN});
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
  for (int n : {8, 128, 136, 256, 264, 512, 688, 1000, 1536, 2048, 4096}) {
    SCOPED_TRACE(n);
    ExpectEveryTileOnce<kBlockN>(rows, n);
    ExpectEveryTileOnce<kFp8TileN>(rows, n);
  }
  ExpectEveryTileOnce<kBlockN>({32768}, 1536);  // every row on one expert
  ExpectEveryTileOnce<kFp8TileN>({32768}, 1536);
  ExpectEveryTileOnce<kBlockN>({0, 0, 5}, 256);  // one group with rows, after empty ones
  ExpectEveryTileOnce<kFp8TileN>({0, 0, 5}, 128);
}

TEST(GroupedGemmTilesTest, RandomGroups) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> group_count(1, 40), rows(0, 700), columns(1, 40);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> group_rows(group_count(random));
    for (int& r : group_rows) r = random() % 4 == 0 ? 0 : rows(random);
    const int n = 8 * columns(random) * (random() % 2 == 0 ? 1 : 16);
    SCOPED_TRACE(trial);
    ExpectEveryTileOnce<kBlockN>(group_rows, n);
    ExpectEveryTileOnce<kFp8TileN>(group_rows, n);
  }
}

// Checks the tail split of `tiles` cluster tiles of k_blocks on `clusters` clusters taken
// round-robin: every (tile, k-block) computed exactly once; the split tiles are the last tail ones,
// each piece 0 after its writer pieces on other clusters and with kMinPieceKBlocks k-blocks or
// more; each cluster holds at most one piece; the writers fit the slots and use each once.
void ExpectEveryKBlockOnce(int tiles, int clusters, int k_blocks, int slots) {
  const TailSplit plan = TailSplit::Of(tiles, clusters, k_blocks, slots);
  ASSERT_EQ(plan.whole + plan.tail, tiles);
  std::map<int, std::vector<int>> covered;  // tile -> count per k-block
  std::map<int, int> pieces_of_cluster;
  std::set<int> fixed_up;  // tiles whose piece 0 came
  std::vector<int> slot_uses(std::max(slots, 0), 0);
  for (int u = 0; u < plan.Units(); ++u) {
    const TileUnit unit = plan.Find(u);
    SCOPED_TRACE("unit " + std::to_string(u));
    ASSERT_GE(unit.tile, 0);
    ASSERT_LT(unit.tile, tiles);
    ASSERT_LE(0, unit.k_begin);
    ASSERT_LT(unit.k_begin, unit.k_end);
    ASSERT_LE(unit.k_end, k_blocks);
    std::vector<int>& count = covered[unit.tile];
    count.resize(k_blocks);
    for (int kb = unit.k_begin; kb < unit.k_end; ++kb) ++count[kb];
    if (unit.pieces == 1) {
      EXPECT_LT(unit.tile, plan.whole);
      EXPECT_EQ(unit.piece, 0);
      continue;
    }
    EXPECT_GE(unit.tile, plan.whole);
    EXPECT_GE(unit.k_end - unit.k_begin, cuda::sm90::kMinPieceKBlocks);
    EXPECT_EQ(++pieces_of_cluster[u % clusters], 1) << "two pieces on one cluster";
    if (unit.WritesPartial()) {
      ASSERT_LT(unit.slot, slots);
      ++slot_uses[unit.slot];
      EXPECT_FALSE(fixed_up.count(unit.tile)) << "a writer after its piece 0";
    } else {
      EXPECT_TRUE(unit.AddsPartials());
      fixed_up.insert(unit.tile);
      EXPECT_EQ(unit.slot, (unit.tile - plan.whole) * (unit.pieces - 1));
    }
  }
  EXPECT_EQ(static_cast<int>(covered.size()), tiles);
  for (const auto& [tile, count] : covered) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      EXPECT_EQ(count[kb], 1) << "tile " << tile << " k-block " << kb;
    }
  }
  for (int slot = 0; slot < plan.Writers(); ++slot) EXPECT_EQ(slot_uses[slot], 1) << slot;
}

TEST(GroupedGemmTilesTest, TailSplitEveryKBlockOnce) {
  // Mixtral-8x7B's fc2 at 4096 tokens, random routing: 544 cluster tiles on 66 clusters, 16 left
  // over, each in 4 pieces of its 224 k-blocks.
  const TailSplit mixtral = TailSplit::Of(544, 66, 224, 66);
  EXPECT_EQ(mixtral.whole, 528);
  EXPECT_EQ(mixtral.tail, 16);
  EXPECT_EQ(mixtral.pieces, 4);
  // No split: no tail, a tail over half the clusters, too few k-blocks, too few slots.
  EXPECT_EQ(TailSplit::Of(528, 66, 224, 66).tail, 0);
  EXPECT_EQ(TailSplit::Of(500, 66, 224, 66).tail, 0);  // 38 left over
  EXPECT_EQ(TailSplit::Of(530, 66, 15, 66).tail, 0);   // one piece of kMinPieceKBlocks
  EXPECT_EQ(TailSplit::Of(530, 66, 224, 0).tail, 0);
  EXPECT_EQ(TailSplit::Of(530, 66, 16, 66).pieces, 2);  // pieces bounded by the k-blocks
  for (int tiles : {1, 2, 5, 66, 67, 70, 140, 544, 1000}) {
    for (int clusters : {1, 2, 7, 66}) {
      for (int k_blocks : {1, 8, 16, 17, 32, 224}) {
        for (int slots : {0, 3, 66}) {
          SCOPED_TRACE(std::to_string(tiles) + " tiles, " + std::to_string(clusters) +
                       " clusters, " + std::to_string(k_blocks) + " k-blocks, " +
                       std::to_string(slots) + " slots");
          ExpectEveryKBlockOnce(tiles, clusters, k_blocks, slots);
        }
      }
    }
  }
}

// Checks the weight-gradient schedule (Schedule: tiles kTileN wide) of `groups` dw matrices (n, k)
// in bands of band_pairs.
template <typename Schedule, int kTileN>
void ExpectEveryWeightGradTileOnce(int groups, int n, int k, int band_pairs) {
  const int m_tiles = (n + kBlockM - 1) / kBlockM, n_tiles = (k + kTileN - 1) / kTileN;
  const Schedule schedule = Schedule::WithBands(n, k, band_pairs);
  ASSERT_EQ(schedule.m_pairs, (m_tiles + 1) / 2);
  ASSERT_EQ(schedule.n_tiles, n_tiles);
  ASSERT_EQ(schedule.band_pairs, band_pairs);
  std::map<std::pair<int, int>, int> count;  // (group, row tile * n_tiles + column tile) -> times
  int idle = 0;
  for (int t = 0; t < groups * schedule.PerGroup(); ++t) {
    const WeightGradClusterTile tile = schedule.Find(t);
    ASSERT_EQ(tile.group, t / schedule.PerGroup()) << "tile " << t << ": group-major";
    ASSERT_EQ(tile.n0 % kTileN, 0) << "tile " << t;
    ASSERT_GE(tile.n0, 0) << "tile " << t;
    ASSERT_LT(tile.n0, k) << "tile " << t;
    for (int rank = 0; rank < 2; ++rank) {
      const int row = tile.Row(rank);
      ASSERT_EQ(row % kBlockM, 0) << "tile " << t << " rank " << rank;
      ASSERT_GE(row, 0) << "tile " << t << " rank " << rank;
      if (row >= n) {  // only the second tile of the last pair, with odd row tiles
        EXPECT_EQ(rank, 1) << "tile " << t;
        EXPECT_EQ(row / kBlockM, m_tiles) << "tile " << t;
        ++idle;
        continue;
      }
      ++count[{tile.group, row / kBlockM * n_tiles + tile.n0 / kTileN}];
    }
  }
  EXPECT_EQ(static_cast<int>(count.size()), groups * m_tiles * n_tiles) << "tiles never computed";
  for (const auto& [tile, times] : count) {
    EXPECT_EQ(times, 1) << "group " << tile.first << " tile " << tile.second;
  }
  EXPECT_EQ(idle, groups * (m_tiles % 2) * n_tiles);
}

TEST(GroupedGemmTilesTest, WeightGradEveryTileOnce) {
  // Row tiles 1, 2, 3 (odd, even), 16, 17, 23 and 224 (Mixtral's fc1); column tiles 1, 2, 3, 16,
  // with tails; bands of one pair, of three and eight (dividing the pairs or leaving a partial
  // band) and of all pairs.
  for (int n : {8, 128, 136, 384, 2048, 2176, 2944, 28672}) {
    for (int k : {8, 256, 264, 768, 4096}) {
      const int m_pairs = ((n + kBlockM - 1) / kBlockM + 1) / 2;
      for (int band : {1, 3, 8, m_pairs}) {
        if (band > m_pairs) continue;
        SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(k) + ", bands of " +
                     std::to_string(band));
        ExpectEveryWeightGradTileOnce<WeightGradClusterSchedule, kBlockN>(3, n, k, band);
        ExpectEveryWeightGradTileOnce<Fp8WeightGradSchedule, kFp8TileN>(3, n, k, band);
      }
    }
  }
}

TEST(GroupedGemmTilesTest, WeightGradBandsOnlyWhereTheAverageDyOutgrowsL2) {
  // Mixtral-8x7B at 4096 tokens (1024 rows per expert): fc1's dy_g (1024 x 28672 bf16, 56 MiB)
  // is banded; fc2's (1024 x 4096, 8 MiB) is one band of all row pairs.
  EXPECT_EQ(WeightGradClusterSchedule::Of(28672, 4096, 8192, 8).band_pairs,
            cuda::sm90::kWeightGradBandPairs);
  EXPECT_EQ(WeightGradClusterSchedule::Of(4096, 14336, 8192, 8).band_pairs, 16);
  // Fewer row pairs than a band: one band of them all.
  EXPECT_EQ(WeightGradClusterSchedule::Of(1024, 1 << 20, 1 << 20, 1).band_pairs, 4);
  // FP8 operands, a byte an element: Mixtral's fc1 dy_g (1024 x 28672, 28 MiB) is banded; with 8
  // micro-batches' parts Qwen3-30B-A3B's fc1 (32768 x 8 rows over 128 experts: 2048 x 1536, 3
  // MiB) is one band; bf16's dy_g of 16 MiB is one band, FP8's of 16 MiB too.
  EXPECT_EQ(Fp8WeightGradSchedule::Of(28672, 4096, 8192, 8).band_pairs,
            cuda::sm90::kWeightGradBandPairs);
  EXPECT_EQ(Fp8WeightGradSchedule::Of(1536, 2048, 262144, 128).band_pairs, 6);
  EXPECT_EQ(WeightGradClusterSchedule::Of(8192, 4096, 1024, 1).band_pairs, 32);
  EXPECT_EQ(Fp8WeightGradSchedule::Of(16384, 4096, 1024, 1).band_pairs, 64);
  EXPECT_EQ(Fp8WeightGradSchedule::Of(16384, 4096, 1025, 1).band_pairs,
            cuda::sm90::kWeightGradBandPairs);
}

TEST(GroupedGemmTilesTest, Fp8WeightGradClustersWhereGroupsAverageOver8TokenTiles) {
  using cuda::sm90::Fp8WeightGradUsesClusters;
  // Qwen3-30B-A3B at 4096 tokens (top 8 of 128 experts): 2 token tiles a group in one part, 16
  // with 8 micro-batches' parts.
  EXPECT_FALSE(Fp8WeightGradUsesClusters(32768, 128));
  EXPECT_TRUE(Fp8WeightGradUsesClusters(262144, 128));
  // Mixtral-8x7B at 4096 tokens (top 2 of 8): exactly 8 a group stays unclustered.
  EXPECT_FALSE(Fp8WeightGradUsesClusters(8192, 8));
  EXPECT_TRUE(Fp8WeightGradUsesClusters(8193, 8));
  // The FP8 probe's cases: its tails (818 rows, 9 groups) unclustered, its clustered tails (6430
  // rows, 6 groups) and two parts (7845 rows, 5 groups) clustered.
  EXPECT_FALSE(Fp8WeightGradUsesClusters(818, 9));
  EXPECT_TRUE(Fp8WeightGradUsesClusters(6430, 6));
  EXPECT_TRUE(Fp8WeightGradUsesClusters(7845, 5));
  // Rows past 2^31 in all parts (8 parts of up to 2^31 - 1 each) do not overflow.
  EXPECT_TRUE(Fp8WeightGradUsesClusters(int64_t{8} * ((int64_t{1} << 31) - 1), 1024));
}

TEST(GroupedGemmTilesTest, WeightGradScheduleAtTheLargestSizes) {
  // n and k just below 2^31: the tile counts without overflow.
  const int64_t largest = (int64_t{1} << 31) - 8;
  const WeightGradClusterSchedule schedule =
      WeightGradClusterSchedule::WithBands(largest, largest, 8);
  EXPECT_EQ(schedule.m_pairs, 8388608);  // ceil(ceil((2^31 - 8) / 128) / 2) = 2^23
  EXPECT_EQ(schedule.n_tiles, 8388608);  // ceil((2^31 - 8) / 256) = 2^23
  EXPECT_EQ(WeightGradClusterSchedule::WithBands(1, 1, 8).m_pairs, 1);
  EXPECT_EQ(WeightGradClusterSchedule::WithBands(129, 257, 8).n_tiles, 2);
  EXPECT_EQ(Fp8WeightGradSchedule::WithBands(largest, largest, 8).n_tiles, 11184811);
  EXPECT_EQ(Fp8WeightGradSchedule::WithBands(129, 193, 8).n_tiles, 2);
}

}  // namespace
}  // namespace moe
