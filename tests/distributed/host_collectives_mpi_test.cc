// Host collectives (engine/distributed/host_collectives.h) under mpirun: the typed all-gather
// returns every rank's values by rank, exactly (integers beyond float's 2^24, doubles, plain
// structs); without a group it returns the caller's own; float sums agree on every rank.
#include "engine/distributed/host_collectives.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/runtime/device_context.h"
#include "tests/distributed/test_world.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

class HostCollectivesTest : public ::testing::Test {
 protected:
  HostCollectivesTest()
      : world_(testing::TestWorld::Get()),
        stream_(DeviceContext::Get(Device::CPU()).CreateSideStream()),
        comm_(world_.NewCommunicator(*stream_)) {}

  World& world_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
};

struct Row {
  int32_t place;
  int64_t bytes;
  double share;
};

TEST_F(HostCollectivesTest, AllGatherReturnsEveryRanksValuesExactly) {
  const int rank = comm_->rank(), size = comm_->size();
  const int64_t big = (int64_t{1} << 40) + 3;  // not representable in f32
  const std::vector<int64_t> mine = {big + rank, -rank, 7};
  const std::vector<int64_t> all = AllGatherHost(comm_.get(), mine);
  ASSERT_EQ(all.size(), 3u * size);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(all[3 * r], big + r);
    EXPECT_EQ(all[3 * r + 1], -r);
    EXPECT_EQ(all[3 * r + 2], 7);
  }
  const std::vector<Row> rows =
      AllGatherHost(comm_.get(), std::vector<Row>{{rank + 1, big * rank, 0.1 * rank}});
  ASSERT_EQ(rows.size(), static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(rows[r].place, r + 1);
    EXPECT_EQ(rows[r].bytes, big * r);
    EXPECT_EQ(rows[r].share, 0.1 * r);
  }
}

TEST_F(HostCollectivesTest, WithoutAGroupTheValuesStay) {
  const std::vector<int64_t> mine = {5, 6};
  EXPECT_EQ(AllGatherHost(static_cast<Communicator*>(nullptr), mine), mine);
  std::vector<float> values = {1.5f, 2.5f};
  AllReduceHostValues(nullptr, values);
  EXPECT_EQ(values, (std::vector<float>{1.5f, 2.5f}));
}

TEST_F(HostCollectivesTest, FloatSumsAreTheSameOnEveryRank) {
  std::vector<float> values = {static_cast<float>(comm_->rank() + 1), 0.25f};
  AllReduceHostValues(comm_.get(), values);
  const int size = comm_->size();
  EXPECT_EQ(values[0], static_cast<float>(size * (size + 1) / 2));
  EXPECT_EQ(values[1], 0.25f * size);
}

}  // namespace
}  // namespace moe
