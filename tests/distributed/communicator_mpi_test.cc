// The Communicator contract (engine/distributed/communicator.h), one source for every backend under
// mpirun: communicator_mpi_test runs it on the MPI communicator with CPU tensors (any number of
// ranks); communicator_cuda_test (MOE_TEST_ON_CUDA) on the NCCL communicator with one GPU per
// rank (at least two ranks: a 2-GPU machine). All-reduce (f32, bf16) with identical bits on every
// rank (and, on MPI, the rank-ordered sum); reduce-scatter (f32, bf16; apart and in place) with
// each part equal to the all-reduce's (bit for bit on MPI); all-gather (apart and in place, exact
// bits); broadcast from every root; grouped transfers where
// every rank sends first; ungrouped transfers in matching order; stream order (a Recv on the comm
// stream, compute waiting on its event); split; two communicators busy on two streams at once;
// barrier. Inputs are uploaded on the compute stream, so the comm stream waits on it first, as
// the contract asks.
#include "engine/distributed/communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/core/bfloat16.h"
#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "tests/distributed/test_world.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

using Clock = std::chrono::steady_clock;

#if MOE_TEST_ON_CUDA
constexpr bool kOnCuda = true;
#else
constexpr bool kOnCuda = false;
#endif

class CommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kOnCuda) {
      ASSERT_GE(world_.size(), 2) << "run under mpirun -np 2 (or more), one rank per GPU";
      StatusOr<Device> device = world_.SelectDevice(DeviceType::kCUDA);
      // Every rank must have its GPU before any of them starts NCCL, or the others would wait in
      // the communicator's creation (e.g. two ranks on a 1-GPU machine).
      const Status agreed = world_.AllAgree(device.ok() ? Status::Ok() : device.status());
      ASSERT_TRUE(agreed.ok()) << agreed.message() << " (this test needs one GPU per rank)";
      device_ = *device;
    }
    stream_ = DeviceContext::Get(device_).CreateSideStream();
    comm_ = world_.NewCommunicator(*stream_, std::chrono::seconds(60));
  }
  void TearDown() override {
    comm_.reset();
    stream_.reset();
  }

  // Values that differ per rank and element, and whose sum depends on the order of addition.
  static std::vector<float> RankValues(int rank, int64_t n) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = (rank % 2 ? -1.0f : 1.0f) * (1.0f + 0.1f * rank) * (i % 7 == 0 ? 3.0e7f : 0.37f) +
             0.001f * static_cast<float>(i);
    }
    return v;
  }

  // An event after the work enqueued so far on the compute stream (e.g. a tensor's upload).
  std::unique_ptr<Event> RecordedOnCompute() {
    Stream& compute = DeviceContext::Get(device_).compute_stream();
    std::unique_ptr<Event> event = compute.CreateEvent();
    event->Record(compute);
    return event;
  }

  // `values` uploaded as `dtype`, ordered before what `comm` enqueues next.
  Tensor Upload(const std::vector<float>& values, DType dtype, Communicator& comm) {
    Tensor t = testing::FromFloats(values, {static_cast<int64_t>(values.size())}, dtype, device_);
    comm.stream().Wait(*RecordedOnCompute());
    return t;
  }
  Tensor Poisoned(int64_t n, Communicator& comm) {
    Tensor t = testing::PoisonedTensor({n}, DType::kF32, device_);
    comm.stream().Wait(*RecordedOnCompute());
    return t;
  }

  // Rank 0's values of `got`, to compare bits with.
  std::vector<float> RankZeros(const std::vector<float>& got, DType dtype) {
    Tensor t = Upload(got, dtype, *comm_);
    comm_->Broadcast(t, 0);
    comm_->stream().Synchronize();
    return testing::ToFloats(t);
  }

  World& world_ = testing::TestWorld::Get();
  Device device_ = Device::CPU();
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(CommunicatorTest, RanksMatchTheWorld) {
  EXPECT_EQ(comm_->rank(), world_.rank());
  EXPECT_EQ(comm_->size(), world_.size());
  EXPECT_EQ(comm_->device(), kOnCuda ? Device::CUDA(world_.local_rank()) : Device::CPU());
}

TEST_F(CommunicatorTest, AllReduceSumF32IsTheSumWithIdenticalBitsOnEveryRank) {
  const int64_t n = kOnCuda ? 3 << 20 : 1000;
  Tensor t = Upload(RankValues(comm_->rank(), n), DType::kF32, *comm_);
  comm_->AllReduceSum(t);
  comm_->stream().Synchronize();
  const std::vector<float> got = testing::ToFloats(t);

  std::vector<float> ordered = RankValues(0, n);  // ((x0 + x1) + x2) + ...
  std::vector<double> exact(ordered.begin(), ordered.end()), magnitude(n);
  for (int64_t i = 0; i < n; ++i) magnitude[i] = std::abs(exact[i]);
  for (int r = 1; r < comm_->size(); ++r) {
    const std::vector<float> x = RankValues(r, n);
    for (int64_t i = 0; i < n; ++i) {
      ordered[i] += x[i];
      exact[i] += x[i];
      magnitude[i] += std::abs(x[i]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], exact[i], 1e-6 * magnitude[i]) << "element " << i;
  }
  if (!kOnCuda) {  // MPI: rank 0 adds in rank order
    ASSERT_EQ(std::memcmp(got.data(), ordered.data(), n * sizeof(float)), 0)
        << "first element: got " << got[0] << ", want " << ordered[0];
  }
  const std::vector<float> reference = RankZeros(got, DType::kF32);
  EXPECT_EQ(std::memcmp(got.data(), reference.data(), n * sizeof(float)), 0)
      << "rank " << comm_->rank() << " differs from rank 0 in its bits";
}

TEST_F(CommunicatorTest, AllReduceSumBf16) {
  const int64_t n = 4097;
  std::vector<float> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((comm_->rank() + 1) * (i % 13)) / 8;
  Tensor t = Upload(mine, DType::kBF16, *comm_);
  comm_->AllReduceSum(t);
  comm_->stream().Synchronize();
  const int ranks = comm_->size();
  const std::vector<float> got = testing::ToFloats(t);
  for (int64_t i = 0; i < n; ++i) {
    const float sum = static_cast<float>(ranks * (ranks + 1) / 2 * (i % 13)) / 8;
    ASSERT_EQ(got[i], BFloat16ToFloat(FloatToBFloat16(sum))) << "element " << i;
  }
  EXPECT_EQ(RankZeros(got, DType::kBF16), got);
}

// Each rank's part of the reduce-scatter is that part of the all-reduce of the same inputs: bit
// for bit on MPI (the same rank-ordered sum), within fp32 summation order on NCCL; apart and in
// place (the output is the input's part `rank`).
TEST_F(CommunicatorTest, ReduceScatterSumIsTheAllReducesPart) {
  const int ranks = comm_->size(), rank = comm_->rank();
  const int64_t n = kOnCuda ? 1 << 20 : 999;
  const std::vector<float> mine = RankValues(rank, ranks * n);
  Tensor all_reduced = Upload(mine, DType::kF32, *comm_);
  comm_->AllReduceSum(all_reduced);
  comm_->stream().Synchronize();
  const std::vector<float> reduced = testing::ToFloats(all_reduced);
  const std::vector<float> want(reduced.begin() + rank * n, reduced.begin() + (rank + 1) * n);
  std::vector<double> magnitude(n, 0.0);  // of the summands, for NCCL's order
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> x = RankValues(r, ranks * n);
    for (int64_t i = 0; i < n; ++i) magnitude[i] += std::abs(x[rank * n + i]);
  }
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "apart");
    Tensor input = Upload(mine, DType::kF32, *comm_);
    Tensor output = in_place ? input.Rows(rank * n, (rank + 1) * n) : Poisoned(n, *comm_);
    comm_->ReduceScatterSum(input, output);
    comm_->stream().Synchronize();
    const std::vector<float> got = testing::ToFloats(output);
    ASSERT_EQ(got.size(), want.size());
    for (int64_t i = 0; i < n; ++i) {
      if (kOnCuda) {
        ASSERT_NEAR(got[i], want[i], 1e-6 * magnitude[i]) << "element " << i;
      } else {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "element " << i << ": " << got[i] << " vs " << want[i];
      }
    }
    if (in_place) {  // the other parts are the caller's, untouched
      const std::vector<float> whole = testing::ToFloats(input);
      for (int r = 0; r < ranks; ++r) {
        if (r == rank) continue;
        for (int64_t i = r * n; i < (r + 1) * n; ++i) ASSERT_EQ(whole[i], mine[i]) << i;
      }
    }
  }
}

TEST_F(CommunicatorTest, ReduceScatterSumBf16) {
  const int ranks = comm_->size();
  const int64_t n = 4097;
  std::vector<float> mine(ranks * n);
  for (int64_t i = 0; i < ranks * n; ++i) {
    mine[i] = static_cast<float>((comm_->rank() + 1) * (i % 13)) / 8;
  }
  Tensor input = Upload(mine, DType::kBF16, *comm_);
  Tensor output = testing::PoisonedTensor({n}, DType::kBF16, device_);
  comm_->stream().Wait(*RecordedOnCompute());
  comm_->ReduceScatterSum(input, output);
  comm_->stream().Synchronize();
  const std::vector<float> got = testing::ToFloats(output);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t element = comm_->rank() * n + i;
    const float sum = static_cast<float>(ranks * (ranks + 1) / 2 * (element % 13)) / 8;
    ASSERT_EQ(got[i], BFloat16ToFloat(FloatToBFloat16(sum))) << "element " << i;
  }
}

// Part r of every rank's output is rank r's input, exact bits (bf16 here), apart and in place.
TEST_F(CommunicatorTest, AllGatherPutsEveryRanksPartInRankOrder) {
  const int ranks = comm_->size(), rank = comm_->rank();
  const int64_t n = kOnCuda ? (1 << 20) + 3 : 1001;
  const auto part_of = [n](int r) { return RankValues(r, n); };
  std::vector<float> want;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> part = testing::ToFloats(
        testing::FromFloats(part_of(r), {n}, DType::kBF16, Device::CPU()));  // as bf16 rounds it
    want.insert(want.end(), part.begin(), part.end());
  }
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "apart");
    Tensor output = testing::PoisonedTensor({ranks * n}, DType::kBF16, device_);
    Tensor input = Upload(part_of(rank), DType::kBF16, *comm_);
    if (in_place) {
      ops::Copy(input, output.Rows(rank * n, (rank + 1) * n));
      input = output.Rows(rank * n, (rank + 1) * n);
      comm_->stream().Wait(*RecordedOnCompute());
    }
    comm_->AllGather(input, output);
    comm_->stream().Synchronize();
    EXPECT_EQ(testing::ToFloats(output), want);
  }
}

TEST_F(CommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm_->size(); ++root) {
    std::vector<int32_t> mine(1000);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 1000 * comm_->rank() + static_cast<int>(i);
    Tensor t = testing::FromInts(mine, {10, 100}, device_);
    comm_->stream().Wait(*RecordedOnCompute());
    comm_->Broadcast(t, root);
    comm_->stream().Synchronize();
    const std::vector<int32_t> got = testing::ToInts(t);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], 1000 * root + static_cast<int>(i)) << "root " << root << ", element " << i;
    }
  }
}

// Every rank sends to both ring neighbours before it receives, in one group, with messages large
// enough for MPI's rendezvous protocol and NCCL's buffers: without the group this would deadlock.
TEST_F(CommunicatorTest, GroupedSendsFirstBothWaysDoNotDeadlock) {
  const int rank = comm_->rank(), size = comm_->size();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const int64_t n = kOnCuda ? 16 << 20 : 1 << 20;  // 64 / 4 MiB of f32
  auto values = [n](int from, float sign) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = sign * (1000.0f * from + static_cast<float>(i % 1000));
    return v;
  };
  Tensor to_next = Upload(values(rank, 1.0f), DType::kF32, *comm_);
  Tensor to_prev = Upload(values(rank, -1.0f), DType::kF32, *comm_);
  Tensor from_prev = Poisoned(n, *comm_);
  Tensor from_next = Poisoned(n, *comm_);
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

TEST_F(CommunicatorTest, UngroupedSendAndRecvInMatchingOrder) {
  if (comm_->size() < 2) GTEST_SKIP() << "needs two ranks";
  if (comm_->rank() > 1) return;
  const int peer = 1 - comm_->rank();
  Tensor mine = Upload({1.0f + comm_->rank(), 2.0f, 3.0f}, DType::kF32, *comm_);
  Tensor theirs = Poisoned(3, *comm_);
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
// the comm stream, and only then reads the data (a copy on the compute stream), which the sender
// sent 300 ms later: reading without the wait would see the poison.
TEST_F(CommunicatorTest, ComputeWaitingOnTheCommStreamSeesReceivedData) {
  if (comm_->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t n = 1 << 20;
  std::vector<float> data(n);
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 4093);
  if (comm_->rank() == 0) {
    Tensor t = Upload(data, DType::kF32, *comm_);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm_->Send(t, 1);
  } else if (comm_->rank() == 1) {
    Tensor received = Poisoned(n, *comm_);
    const auto start = Clock::now();
    comm_->Recv(received, 0);
    std::unique_ptr<Event> arrived = comm_->stream().CreateEvent();
    arrived->Record(comm_->stream());
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200)) << "Recv blocked the host";
    EXPECT_FALSE(arrived->Query()) << "the data arrived before it was sent";
    DeviceContext::Get(device_).compute_stream().Wait(*arrived);
    EXPECT_EQ(testing::ToFloats(received), data);
  }
  comm_->stream().Synchronize();
}

TEST_F(CommunicatorTest, SplitMakesGroupsRankedByKey) {
  const int rank = comm_->rank(), size = comm_->size();
  std::unique_ptr<Stream> split_stream = DeviceContext::Get(device_).CreateSideStream();
  // Two groups by parity, each ranked in reverse order of world rank.
  std::unique_ptr<Communicator> group = comm_->Split(rank % 2, -rank, *split_stream);
  std::vector<int> members;
  for (int r = 0; r < size; ++r) {
    if (r % 2 == rank % 2) members.insert(members.begin(), r);
  }
  ASSERT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[group->rank()], rank);
  EXPECT_EQ(&group->stream(), split_stream.get());
  Tensor t = Upload({static_cast<float>(rank)}, DType::kF32, *group);
  group->AllReduceSum(t);
  group->stream().Synchronize();
  float want = 0;
  for (int r : members) want += static_cast<float>(r);
  EXPECT_EQ(testing::ToFloats(t)[0], want);
}

// A data-parallel all-reduce on one stream while pipeline transfers run on another: both
// communicators are busy at once (MPI: both worker threads inside MPI, MPI_THREAD_MULTIPLE).
TEST_F(CommunicatorTest, TwoCommunicatorsOnTwoStreamsAtOnce) {
  const int rank = comm_->rank(), size = comm_->size();
  std::unique_ptr<Stream> dp_stream = DeviceContext::Get(device_).CreateSideStream();
  std::unique_ptr<Communicator> dp = comm_->Split(0, rank, *dp_stream);
  const int64_t n = kOnCuda ? 1 << 22 : 1 << 18;
  for (int iteration = 0; iteration < 3; ++iteration) {
    Tensor grads = Upload(std::vector<float>(n, 1.0f), DType::kF32, *dp);
    Tensor out = Upload(std::vector<float>(n, static_cast<float>(rank)), DType::kF32, *comm_);
    Tensor in = Poisoned(n, *comm_);
    dp->AllReduceSum(grads);
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

TEST_F(CommunicatorTest, BarrierWaitsForTheLastRank) {
  if (comm_->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  comm_->Barrier();
  if (comm_->rank() != 0) {
    EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(200)) << "left before rank 0 came";
  }
}

}  // namespace
}  // namespace moe
