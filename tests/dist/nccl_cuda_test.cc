// The NCCL communicator on CUDA tensors. Needs one GPU per rank and at least two ranks: run it
// under `mpirun -np 2` on a 2-GPU machine. All-reduce (f32, bf16) identical on every rank,
// broadcast, grouped transfers where every rank sends first, split, stream order (a Recv on the
// comm stream, then compute waiting on an event), barrier, two communicators on two streams.
#include "engine/dist/cuda_nccl_communicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/core/bfloat16.h"
#include "engine/runtime/device_context.h"
#include "tests/dist/test_world.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(world_.size(), 2) << "run under mpirun -np 2 (or more), one rank per GPU";
    StatusOr<Device> device = world_.SelectDevice(DeviceType::kCUDA);
    // Every rank must have its GPU before any of them starts NCCL, or the others would wait in
    // the communicator's creation (e.g. two ranks on a 1-GPU machine).
    const Status agreed = world_.AllAgree(device.ok() ? Status::Ok() : device.status());
    ASSERT_TRUE(agreed.ok()) << agreed.message() << " (this test needs one GPU per rank)";
    device_ = *device;
    stream_ = DeviceContext::Get(device_).CreateSideStream();
    comm_ = world_.NewCommunicator(*stream_, std::chrono::seconds(60));
  }
  void TearDown() override {
    comm_.reset();
    stream_.reset();
  }

  // Rank 0's values of `got`, to compare bits with.
  std::vector<float> RankZeros(const std::vector<float>& got, DType dtype) {
    Tensor t = testing::FromFloats(got, {static_cast<int64_t>(got.size())}, dtype, device_);
    comm_->stream().Wait(*RecordedOnCompute());
    comm_->Broadcast(t, 0);
    comm_->stream().Synchronize();
    return testing::ToFloats(t);
  }

  // An event after the work enqueued so far on the compute stream (e.g. a tensor's upload).
  std::unique_ptr<Event> RecordedOnCompute() {
    Stream& compute = DeviceContext::Get(device_).compute_stream();
    std::unique_ptr<Event> event = compute.CreateEvent();
    event->Record(compute);
    return event;
  }

  World& world_ = testing::TestWorld::Get();
  Device device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(NcclTest, RanksMatchTheWorld) {
  EXPECT_EQ(comm_->rank(), world_.rank());
  EXPECT_EQ(comm_->size(), world_.size());
  EXPECT_EQ(comm_->device(), Device::CUDA(world_.local_rank()));
}

TEST_F(NcclTest, AllReduceSumF32IsTheSumWithIdenticalBitsOnEveryRank) {
  const int64_t n = 3 << 20;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < comm_->size(); ++r) {
    std::mt19937 rng(1234 + r);  // every rank knows every rank's input
    inputs.push_back(testing::RandomFloats(n, rng));
  }
  Tensor t = testing::FromFloats(inputs[comm_->rank()], {n}, DType::kF32, device_);
  comm_->stream().Wait(*RecordedOnCompute());
  comm_->AllReduceSum(t);
  comm_->stream().Synchronize();
  const std::vector<float> got = testing::ToFloats(t);
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (const auto& input : inputs) want += input[i];
    ASSERT_NEAR(got[i], want, 1e-5 * (1 + std::abs(want))) << "element " << i;
  }
  const std::vector<float> reference = RankZeros(got, DType::kF32);
  EXPECT_EQ(std::memcmp(got.data(), reference.data(), n * sizeof(float)), 0)
      << "rank " << comm_->rank() << " differs from rank 0 in its bits";
}

TEST_F(NcclTest, AllReduceSumBf16) {
  const int64_t n = 4097;
  std::vector<float> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((comm_->rank() + 1) * (i % 13)) / 8;
  Tensor t = testing::FromFloats(mine, {n}, DType::kBF16, device_);
  comm_->stream().Wait(*RecordedOnCompute());
  comm_->AllReduceSum(t);
  comm_->stream().Synchronize();
  const int n_ranks = comm_->size();
  const std::vector<float> got = testing::ToFloats(t);
  for (int64_t i = 0; i < n; ++i) {  // small multiples of 1/8: exact in bf16
    ASSERT_EQ(got[i], static_cast<float>(n_ranks * (n_ranks + 1) / 2 * (i % 13)) / 8) << i;
  }
  EXPECT_EQ(RankZeros(got, DType::kBF16), got);
}

TEST_F(NcclTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm_->size(); ++root) {
    std::vector<int32_t> mine(1000);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 1000 * comm_->rank() + static_cast<int>(i);
    Tensor t = testing::FromInts(mine, {10, 100}, device_);
    comm_->stream().Wait(*RecordedOnCompute());
    comm_->Broadcast(t, root);
    comm_->stream().Synchronize();
    const std::vector<int32_t> got = testing::ToInts(t);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 1000 * root + static_cast<int>(i));
  }
}

TEST_F(NcclTest, GroupedSendsFirstBothWaysDoNotDeadlock) {
  const int rank = comm_->rank(), size = comm_->size();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const int64_t n = 16 << 20;  // 64 MiB of f32
  auto values = [n](int from, float sign) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = sign * (1000.0f * from + static_cast<float>(i % 1000));
    return v;
  };
  Tensor to_next = testing::FromFloats(values(rank, 1.0f), {n}, DType::kF32, device_);
  Tensor to_prev = testing::FromFloats(values(rank, -1.0f), {n}, DType::kF32, device_);
  Tensor from_prev = testing::PoisonedTensor({n}, DType::kF32, device_);
  Tensor from_next = testing::PoisonedTensor({n}, DType::kF32, device_);
  comm_->stream().Wait(*RecordedOnCompute());
  comm_->GroupStart();
  comm_->Send(to_next, next);
  comm_->Send(to_prev, prev);
  comm_->Recv(from_prev, prev);
  comm_->Recv(from_next, next);
  comm_->GroupEnd();
  comm_->stream().Synchronize();
  EXPECT_EQ(testing::ToFloats(from_prev), values(prev, 1.0f));
  EXPECT_EQ(testing::ToFloats(from_next), values(next, -1.0f));
}

// Rank 1's compute stream waits on the comm stream's event, then copies what it received; rank 0
// sends 300 ms late, so reading without the wait would see the poison.
TEST_F(NcclTest, ComputeWaitingOnTheCommStreamSeesReceivedData) {
  const int64_t n = 1 << 20;
  std::vector<float> data(n);
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 4093);
  if (comm_->rank() == 0) {
    Tensor t = testing::FromFloats(data, {n}, DType::kF32, device_);
    comm_->stream().Wait(*RecordedOnCompute());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm_->Send(t, 1);
  } else if (comm_->rank() == 1) {
    Tensor received = testing::PoisonedTensor({n}, DType::kF32, device_);
    comm_->stream().Wait(*RecordedOnCompute());
    comm_->Recv(received, 0);
    std::unique_ptr<Event> arrived = comm_->stream().CreateEvent();
    arrived->Record(comm_->stream());
    DeviceContext::Get(device_).compute_stream().Wait(*arrived);
    EXPECT_EQ(testing::ToFloats(received), data);  // a copy on the compute stream
  }
  comm_->stream().Synchronize();
}

TEST_F(NcclTest, SplitMakesGroupsRankedByKey) {
  const int rank = comm_->rank(), size = comm_->size();
  std::unique_ptr<Stream> split_stream = DeviceContext::Get(device_).CreateSideStream();
  std::unique_ptr<Communicator> group = comm_->Split(rank % 2, -rank, *split_stream);
  std::vector<int> members;
  for (int r = 0; r < size; ++r) {
    if (r % 2 == rank % 2) members.insert(members.begin(), r);
  }
  ASSERT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[group->rank()], rank);
  Tensor t = testing::FromFloats({static_cast<float>(rank)}, {1}, DType::kF32, device_);
  group->stream().Wait(*RecordedOnCompute());
  group->AllReduceSum(t);
  group->stream().Synchronize();
  float want = 0;
  for (int r : members) want += static_cast<float>(r);
  EXPECT_EQ(testing::ToFloats(t)[0], want);
  group.reset();
}

TEST_F(NcclTest, TwoCommunicatorsOnTwoStreamsAtOnce) {
  const int rank = comm_->rank(), size = comm_->size();
  std::unique_ptr<Stream> dp_stream = DeviceContext::Get(device_).CreateSideStream();
  std::unique_ptr<Communicator> dp = comm_->Split(0, rank, *dp_stream);
  const int64_t n = 1 << 22;
  for (int iteration = 0; iteration < 3; ++iteration) {
    Tensor grads = testing::FromFloats(std::vector<float>(n, 1.0f), {n}, DType::kF32, device_);
    Tensor out = testing::FromFloats(std::vector<float>(n, static_cast<float>(rank)), {n},
                                     DType::kF32, device_);
    Tensor in = testing::PoisonedTensor({n}, DType::kF32, device_);
    std::unique_ptr<Event> uploaded = RecordedOnCompute();
    dp->stream().Wait(*uploaded);
    comm_->stream().Wait(*uploaded);
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
  dp.reset();
}

TEST_F(NcclTest, BarrierWaitsForTheLastRank) {
  if (comm_->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  comm_->Barrier();
  if (comm_->rank() != 0) {
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  }
}

}  // namespace
}  // namespace moe
