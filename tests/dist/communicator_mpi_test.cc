// The MPI communicator on CPU tensors, under mpirun (any number of ranks): exact, bit-identical
// all-reduce; broadcast; grouped transfers where every rank sends first; splits; stream order
// (a Recv on the comm stream, then compute waiting on an event); Barrier; two communicators busy
// on two streams at once (MPI_THREAD_MULTIPLE).
#include "engine/dist/communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/core/bfloat16.h"
#include "engine/runtime/device_context.h"
#include "tests/dist/test_world.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

using Clock = std::chrono::steady_clock;

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  MpiCommunicatorTest()
      : world_(testing::TestWorld::Get()),
        stream_(DeviceContext::Get(Device::CPU()).CreateSideStream()),
        comm_(world_.NewCommunicator(*stream_, std::chrono::seconds(60))) {}

  // Values that differ per rank and element, and whose sum depends on the order of addition.
  static std::vector<float> RankValues(int rank, int64_t n) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = (rank % 2 ? -1.0f : 1.0f) * (1.0f + 0.1f * rank) * (i % 7 == 0 ? 3.0e7f : 0.37f) +
             0.001f * static_cast<float>(i);
    }
    return v;
  }

  // Rank 0's result on every rank, to compare bits with.
  Tensor RankZerosCopy(const Tensor& t) {
    Tensor copy = Tensor::Empty(t.shape(), t.dtype(), t.device());
    std::memcpy(copy.data(), t.data(), t.nbytes());
    comm_->Broadcast(copy, 0);
    comm_->stream().Synchronize();
    return copy;
  }

  World& world_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(MpiCommunicatorTest, RanksMatchTheWorld) {
  EXPECT_EQ(comm_->rank(), world_.rank());
  EXPECT_EQ(comm_->size(), world_.size());
  EXPECT_EQ(comm_->device(), Device::CPU());
}

TEST_F(MpiCommunicatorTest, AllReduceSumF32IsTheRankOrderedSumWithIdenticalBits) {
  const int64_t n = 1000;
  Tensor t =
      testing::FromFloats(RankValues(comm_->rank(), n), {10, 100}, DType::kF32, Device::CPU());
  comm_->AllReduceSum(t);
  comm_->stream().Synchronize();

  std::vector<float> want = RankValues(0, n);
  for (int r = 1; r < comm_->size(); ++r) {
    const std::vector<float> x = RankValues(r, n);
    for (int64_t i = 0; i < n; ++i) want[i] += x[i];  // ((x0 + x1) + x2) + ...
  }
  const std::vector<float> got = testing::ToFloats(t);
  ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
      << "first element: got " << got[0] << ", want " << want[0];
  Tensor reference = RankZerosCopy(t);
  EXPECT_EQ(std::memcmp(t.data(), reference.data(), t.nbytes()), 0)
      << "rank " << comm_->rank() << " differs from rank 0 in its bits";
}

TEST_F(MpiCommunicatorTest, AllReduceSumBf16AccumulatesInF32) {
  const int64_t n = 257;
  std::vector<float> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((comm_->rank() + 1) * (i % 13)) / 8;
  Tensor t = testing::FromFloats(mine, {n}, DType::kBF16, Device::CPU());
  comm_->AllReduceSum(t);
  comm_->stream().Synchronize();

  const int n_ranks = comm_->size();
  const std::vector<float> got = testing::ToFloats(t);
  for (int64_t i = 0; i < n; ++i) {
    const float sum = static_cast<float>(n_ranks * (n_ranks + 1) / 2 * (i % 13)) / 8;
    ASSERT_EQ(got[i], BFloat16ToFloat(FloatToBFloat16(sum))) << "element " << i;
  }
  Tensor reference = RankZerosCopy(t);
  EXPECT_EQ(std::memcmp(t.data(), reference.data(), t.nbytes()), 0);
}

TEST_F(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm_->size(); ++root) {
    std::vector<int32_t> mine(333);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 1000 * comm_->rank() + static_cast<int>(i);
    Tensor t = testing::FromInts(mine, {3, 111}, Device::CPU());
    comm_->Broadcast(t, root);
    comm_->stream().Synchronize();
    const std::vector<int32_t> got = testing::ToInts(t);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], 1000 * root + static_cast<int>(i)) << "root " << root << ", element " << i;
    }
  }
}

// Every rank sends to both ring neighbours before it receives, in one group, with messages large
// enough for MPI's rendezvous protocol: without the group this would deadlock.
TEST_F(MpiCommunicatorTest, GroupedSendsFirstBothWaysDoNotDeadlock) {
  const int rank = comm_->rank(), size = comm_->size();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const int64_t n = 1 << 20;  // 4 MiB of f32
  auto values = [n](int from, float sign) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = sign * (1000.0f * from + static_cast<float>(i % 1000));
    return v;
  };
  Tensor to_next = testing::FromFloats(values(rank, 1.0f), {n}, DType::kF32, Device::CPU());
  Tensor to_prev = testing::FromFloats(values(rank, -1.0f), {n}, DType::kF32, Device::CPU());
  Tensor from_prev = testing::PoisonedTensor({n}, DType::kF32, Device::CPU());
  Tensor from_next = testing::PoisonedTensor({n}, DType::kF32, Device::CPU());

  comm_->GroupStart();
  comm_->Send(to_next, next);
  comm_->Send(to_prev, prev);
  comm_->Recv(from_prev, prev);  // prev sent to its next (us) first
  comm_->Recv(from_next, next);
  comm_->GroupEnd();
  comm_->stream().Synchronize();

  EXPECT_EQ(testing::ToFloats(from_prev), values(prev, 1.0f));
  EXPECT_EQ(testing::ToFloats(from_next), values(next, -1.0f));
}

TEST_F(MpiCommunicatorTest, UngroupedSendAndRecvInMatchingOrder) {
  if (comm_->size() < 2) GTEST_SKIP() << "needs two ranks";
  if (comm_->rank() > 1) return;
  const int peer = 1 - comm_->rank();
  Tensor mine =
      testing::FromFloats({1.0f + comm_->rank(), 2.0f, 3.0f}, {3}, DType::kF32, Device::CPU());
  Tensor theirs = testing::PoisonedTensor({3}, DType::kF32, Device::CPU());
  if (comm_->rank() == 0) {
    comm_->Send(mine, peer);
    comm_->Recv(theirs, peer);
  } else {
    comm_->Recv(theirs, peer);
    comm_->Send(mine, peer);
  }
  comm_->stream().Synchronize();
  EXPECT_EQ(testing::ToFloats(theirs), (std::vector<float>{1.0f + peer, 2.0f, 3.0f}));
}

// The receiver's host enqueues the Recv and goes on; compute then waits on an event recorded on
// the comm stream, and only then sees the data, which the sender sent 300 ms later.
TEST_F(MpiCommunicatorTest, ComputeWaitingOnTheCommStreamSeesReceivedData) {
  if (comm_->size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<float> data = {4.0f, 5.0f, 6.0f, 7.0f};
  if (comm_->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm_->Send(testing::FromFloats(data, {4}, DType::kF32, Device::CPU()), 1);
  } else if (comm_->rank() == 1) {
    Tensor received = testing::PoisonedTensor({4}, DType::kF32, Device::CPU());
    const auto start = Clock::now();
    comm_->Recv(received, 0);
    std::unique_ptr<Event> arrived = comm_->stream().CreateEvent();
    arrived->Record(comm_->stream());
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200)) << "Recv blocked the host";
    EXPECT_FALSE(arrived->Query()) << "the data arrived before it was sent";
    Stream& compute = DeviceContext::Get(Device::CPU()).compute_stream();
    compute.Wait(*arrived);  // the CPU compute stream is inline: this blocks until the Recv is done
    EXPECT_EQ(testing::ToFloats(received), data);
  }
  comm_->stream().Synchronize();
}

TEST_F(MpiCommunicatorTest, SplitMakesGroupsRankedByKey) {
  const int rank = comm_->rank(), size = comm_->size();
  std::unique_ptr<Stream> split_stream = DeviceContext::Get(Device::CPU()).CreateSideStream();
  // Two groups by parity, each ranked in reverse order of world rank.
  std::unique_ptr<Communicator> group = comm_->Split(rank % 2, -rank, *split_stream);
  std::vector<int> members;
  for (int r = 0; r < size; ++r) {
    if (r % 2 == rank % 2) members.insert(members.begin(), r);
  }
  ASSERT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[group->rank()], rank);
  EXPECT_EQ(&group->stream(), split_stream.get());

  Tensor t = testing::FromFloats({static_cast<float>(rank)}, {1}, DType::kF32, Device::CPU());
  group->AllReduceSum(t);
  group->stream().Synchronize();
  float want = 0;
  for (int r : members) want += static_cast<float>(r);
  EXPECT_EQ(testing::ToFloats(t)[0], want);
}

// A data-parallel all-reduce on one stream while pipeline transfers run on another: both
// communicators' worker threads are inside MPI at once.
TEST_F(MpiCommunicatorTest, TwoCommunicatorsOnTwoStreamsAtOnce) {
  const int rank = comm_->rank(), size = comm_->size();
  std::unique_ptr<Stream> dp_stream = DeviceContext::Get(Device::CPU()).CreateSideStream();
  std::unique_ptr<Communicator> dp = comm_->Split(0, rank, *dp_stream);
  const int64_t n = 1 << 18;
  for (int iteration = 0; iteration < 5; ++iteration) {
    Tensor grads =
        testing::FromFloats(std::vector<float>(n, 1.0f), {n}, DType::kF32, Device::CPU());
    dp->AllReduceSum(grads);
    Tensor out = testing::FromFloats(std::vector<float>(n, static_cast<float>(rank)), {n},
                                     DType::kF32, Device::CPU());
    Tensor in = testing::PoisonedTensor({n}, DType::kF32, Device::CPU());
    comm_->GroupStart();
    comm_->Send(out, (rank + 1) % size);
    comm_->Recv(in, (rank + size - 1) % size);
    comm_->GroupEnd();
    dp->stream().Synchronize();
    comm_->stream().Synchronize();
    EXPECT_EQ(testing::ToFloats(grads), std::vector<float>(n, static_cast<float>(size)));
    EXPECT_EQ(testing::ToFloats(in),
              std::vector<float>(n, static_cast<float>((rank + size - 1) % size)));
  }
}

TEST_F(MpiCommunicatorTest, BarrierWaitsForTheLastRank) {
  if (comm_->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  comm_->Barrier();
  if (comm_->rank() != 0) {
    EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(200)) << "left before rank 0 came";
  }
}

}  // namespace
}  // namespace moe
