// The one-rank communicator (builds without MPI): collectives leave tensors as they are (or copy
// the one part), a group's sends to itself land in its receives in order, in stream order.
#include "engine/distributed/single_rank_communicator.h"

#include <gtest/gtest.h>

#include "engine/runtime/device_context.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

class SingleRankCommunicatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Stream> stream_ = DeviceContext::Get(Device::CPU()).CreateSideStream();
  SingleRankCommunicator comm_{*stream_, kDefaultCommTimeout};
};

TEST_F(SingleRankCommunicatorTest, CollectivesOfOneRankKeepTheTensor) {
  EXPECT_EQ(comm_.rank(), 0);
  EXPECT_EQ(comm_.size(), 1);
  Tensor t = testing::FromFloats({1.5f, -2.0f}, {2}, DType::kF32, Device::CPU());
  comm_.AllReduceSum(t);
  comm_.Broadcast(t, 0);
  comm_.Barrier();
  EXPECT_EQ(testing::ToFloats(t), (std::vector<float>{1.5f, -2.0f}));
}

TEST_F(SingleRankCommunicatorTest, ReduceScatterAndAllGatherOfOneRankCopy) {
  Tensor in = testing::FromFloats({1.5f, -2.0f}, {2}, DType::kF32, Device::CPU());
  Tensor scattered = testing::PoisonedTensor({2}, DType::kF32, Device::CPU());
  Tensor gathered = testing::PoisonedTensor({2}, DType::kF32, Device::CPU());
  comm_.ReduceScatterSum(in, scattered);
  comm_.AllGather(scattered, gathered);
  comm_.ReduceScatterSum(in, in);  // in place
  comm_.AllGather(in, in);
  comm_.Barrier();
  EXPECT_EQ(testing::ToFloats(gathered), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(testing::ToFloats(in), (std::vector<float>{1.5f, -2.0f}));
}

TEST_F(SingleRankCommunicatorTest, GroupedSendsToSelfLandInOrder) {
  Tensor a = testing::FromFloats({1, 2}, {2}, DType::kF32, Device::CPU());
  Tensor b = testing::FromFloats({3, 4, 5}, {3}, DType::kF32, Device::CPU());
  Tensor got_a = testing::PoisonedTensor({2}, DType::kF32, Device::CPU());
  Tensor got_b = testing::PoisonedTensor({3}, DType::kF32, Device::CPU());
  comm_.GroupStart();
  comm_.Send(a, 0);
  comm_.Recv(got_a, 0);
  comm_.Recv(got_b, 0);
  comm_.Send(b, 0);
  comm_.GroupEnd();
  std::unique_ptr<Event> done = comm_.stream().CreateEvent();
  done->Record(comm_.stream());
  DeviceContext::Get(Device::CPU()).compute_stream().Wait(*done);
  EXPECT_EQ(testing::ToFloats(got_a), (std::vector<float>{1, 2}));
  EXPECT_EQ(testing::ToFloats(got_b), (std::vector<float>{3, 4, 5}));
}

TEST_F(SingleRankCommunicatorTest, SplitGivesAnotherSingleRank) {
  std::unique_ptr<Stream> other = DeviceContext::Get(Device::CPU()).CreateSideStream();
  std::unique_ptr<Communicator> split = comm_.Split(3, 0, *other);
  EXPECT_EQ(split->size(), 1);
  EXPECT_EQ(&split->stream(), other.get());
}

TEST(SingleRankCommunicatorDeathTest, AnUnmatchedSendToSelfIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::unique_ptr<Stream> stream = DeviceContext::Get(Device::CPU()).CreateSideStream();
        SingleRankCommunicator comm(*stream, kDefaultCommTimeout);
        comm.Send(testing::FromFloats({1}, {1}, DType::kF32, Device::CPU()), 0);
      },
      "matches each send to itself with a receive in the same group");
}

TEST(SingleRankCommunicatorDeathTest, CollectivesInsideAGroupAreABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::unique_ptr<Stream> stream = DeviceContext::Get(Device::CPU()).CreateSideStream();
        SingleRankCommunicator comm(*stream, kDefaultCommTimeout);
        comm.GroupStart();
        comm.AllReduceSum(testing::FromFloats({1}, {1}, DType::kF32, Device::CPU()));
      },
      "AllReduceSum inside a group");
}

}  // namespace
}  // namespace moe
