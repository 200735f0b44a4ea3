// World under mpirun: rank, size and local rank, the rank in failure messages, device selection,
// and AllAgree (one failing rank fails every rank with the same message).
#include "engine/distributed/world.h"

#include <gtest/gtest.h>

#include "engine/core/check.h"
#include "engine/runtime/device_context.h"
#include "tests/distributed/test_world.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

TEST(WorldTest, RanksAndSizes) {
  World& world = testing::TestWorld::Get();
  EXPECT_GE(world.size(), 1);
  EXPECT_GE(world.rank(), 0);
  EXPECT_LT(world.rank(), world.size());
  EXPECT_GE(world.local_rank(), 0);
  EXPECT_LT(world.local_rank(), world.local_size());
  EXPECT_LE(world.local_size(), world.size());
  EXPECT_LE(world.local_rank(), world.rank());
  EXPECT_EQ(ProcessRank(), world.rank()) << "failure messages must name this rank";
}

TEST(WorldTest, SelectsTheCpu) {
  StatusOr<Device> device = testing::TestWorld::Get().SelectDevice(DeviceType::kCPU);
  ASSERT_TRUE(device.ok()) << device.status().message();
  EXPECT_EQ(*device, Device::CPU());
}

TEST(WorldTest, TooFewGpusForTheLocalRanksIsAnError) {
  World& world = testing::TestWorld::Get();
  if (CudaDeviceCount() > world.local_rank()) GTEST_SKIP() << "this host has a GPU for this rank";
  StatusOr<Device> device = world.SelectDevice(DeviceType::kCUDA);
  ASSERT_FALSE(device.ok());
  EXPECT_NE(device.status().message().find("local rank " + std::to_string(world.local_rank()) +
                                           " of " + std::to_string(world.local_size())),
            std::string::npos)
      << device.status().message();
}

TEST(WorldTest, AllAgreeIsOkWhenEveryRankIsOk) {
  EXPECT_TRUE(testing::TestWorld::Get().AllAgree(Status::Ok()).ok());
}

TEST(WorldTest, AllAgreeFailsEveryRankWhenOneFails) {
  World& world = testing::TestWorld::Get();
  const int failing = world.size() - 1;
  const Status local = world.rank() == failing
                           ? InvalidArgument("--pipeline_parallel=3 does not divide the ranks")
                           : Status::Ok();
  const Status agreed = world.AllAgree(local);
  ASSERT_FALSE(agreed.ok()) << "rank " << world.rank() << " did not see rank " << failing
                            << "'s failure";
  EXPECT_EQ(agreed.code(), StatusCode::kInvalidArgument);
  std::string want = "--pipeline_parallel=3 does not divide the ranks";
  if (world.size() > 1) {
    want += " (rank " + std::to_string(failing) + "; 1 of " + std::to_string(world.size()) +
            " ranks failed)";
  }
  EXPECT_EQ(agreed.message(), want);
}

TEST(WorldTest, AllAgreeReportsTheLowestFailingRank) {
  World& world = testing::TestWorld::Get();
  const Status local = world.rank() == 0
                           ? NotFound("no file on rank 0")
                           : DataLoss("corrupt on rank " + std::to_string(world.rank()));
  const Status agreed = world.AllAgree(local);
  ASSERT_FALSE(agreed.ok());
  EXPECT_EQ(agreed.code(), StatusCode::kNotFound);
  EXPECT_EQ(agreed.message().rfind("no file on rank 0", 0), 0u) << agreed.message();
  if (world.size() > 1) {
    EXPECT_NE(agreed.message().find(std::to_string(world.size()) + " of " +
                                    std::to_string(world.size()) + " ranks failed"),
              std::string::npos)
        << agreed.message();
  }
}

}  // namespace
}  // namespace moe
