// CUDA streams, events, the caching allocator's stream safety and the pinned pool, on a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "engine/core/cuda_check.h"
#include "engine/kernels/ops.h"
#include "engine/runtime/cuda_stream.h"
#include "engine/runtime/device_context.h"

namespace moe {
namespace {

class CudaRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  }
};

// Holds `stream` at a host callback until Release() is called.
class StreamBlocker {
 public:
  explicit StreamBlocker(Stream& stream) {
    MOE_CUDA_CALL(
        cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.native_handle()), &Block, &gate_));
  }
  void Release() { gate_.set_value(); }

 private:
  static void Block(void* gate) { static_cast<std::promise<void>*>(gate)->get_future().wait(); }
  std::promise<void> gate_;
};

TEST_F(CudaRuntimeTest, CopiesRoundTripThroughPinnedMemory) {
  DeviceContext& context = DeviceContext::Get(Device::CUDA(0));
  std::vector<float> values(1 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  Tensor pinned = Tensor::Empty({1 << 20}, DType::kF32, Device::CUDA(0), MemorySpace::kPinnedHost);
  std::memcpy(pinned.data(), values.data(), pinned.nbytes());
  cudaPointerAttributes attributes;
  MOE_CUDA_CALL(cudaPointerGetAttributes(&attributes, pinned.data()));
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "pool memory is not page-locked";

  Tensor device = Tensor::Empty({1 << 20}, DType::kF32, Device::CUDA(0));
  auto side = context.CreateSideStream();
  side->CopyAsync(device.data(), pinned.data(), pinned.nbytes());  // H2D on a side stream
  auto done = side->CreateEvent(false);
  done->Record(*side);
  context.compute_stream().Wait(*done);
  std::vector<float> back(values.size());
  ops::CopyToHost(device, back.data());  // on the compute stream, after the wait
  EXPECT_EQ(back, values);
}

// Small reads (routing offsets before each grouped GEMM) must not wait for a large transfer on a
// copy stream, as one layer's offload copy would make them: the read returns, correct, while a
// 1 GiB device-to-host copy (about 20 ms) is still in flight.
TEST_F(CudaRuntimeTest, SmallReadsDoNotQueueBehindCopyStreamTransfers) {
  DeviceContext& context = DeviceContext::Get(Device::CUDA(0));
  const int64_t big = int64_t{1} << 30;
  Tensor device = Tensor::Empty({big}, DType::kU8, Device::CUDA(0));
  Tensor pinned = Tensor::Empty({big}, DType::kU8, Device::CUDA(0), MemorySpace::kPinnedHost);
  Tensor words = Tensor::Empty({129}, DType::kI32, Device::CUDA(0));
  Tensor halves = Tensor::Empty({5}, DType::kBF16, Device::CUDA(0));
  ops::Fill(words, 7.0f);
  ops::Fill(halves, 1.5f);
  // The first launch of a kernel loads its module (lazy loading), which itself waits for the copy
  // engines: read through both kernels once before the big copy starts.
  std::vector<int32_t> got(129);
  uint16_t odd[3];  // an odd byte count at an odd element: the byte path
  ops::CopyToHost(words, got.data());
  ops::CopyToHost(halves.Rows(1, 4), odd);

  auto side = context.CreateSideStream();
  side->CopyAsync(pinned.data(), device.data(), device.nbytes());
  auto copied = side->CreateEvent(false);
  copied->Record(*side);
  ops::Fill(words, 3.0f);  // ordered before the read on the compute stream
  ops::Fill(halves, -2.0f);
  ops::CopyToHost(words, got.data());
  ops::CopyToHost(halves.Rows(1, 4), odd);
  EXPECT_FALSE(copied->Query()) << "the small read waited for the 1 GiB copy";
  EXPECT_EQ(got, std::vector<int32_t>(129, 3));
  for (uint16_t bits : odd) EXPECT_EQ(bits, 0xc000) << "bf16 -2";
  side->Synchronize();
}

TEST_F(CudaRuntimeTest, EventsOrderStreamsAndMeasureTime) {
  DeviceContext& context = DeviceContext::Get(Device::CUDA(0));
  auto side = context.CreateSideStream();
  StreamBlocker blocker(*side);
  auto marker = side->CreateEvent(true);
  marker->Record(*side);
  EXPECT_FALSE(marker->Query()) << "event completed while its stream is held";
  blocker.Release();
  marker->Synchronize();
  EXPECT_TRUE(marker->Query());

  auto start = side->CreateEvent(true), stop = side->CreateEvent(true);
  Tensor a = Tensor::Empty({64 << 20}, DType::kU8, Device::CUDA(0));
  Tensor b = Tensor::Empty({64 << 20}, DType::kU8, Device::CUDA(0));
  start->Record(*side);
  side->CopyAsync(b.data(), a.data(), a.nbytes());
  stop->Record(*side);
  const float ms = stop->ElapsedMillisecondsSince(*start);
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 1000.0f);
}

TEST_F(CudaRuntimeTest, BlockUsedOnAnotherStreamIsNotReusedEarly) {
  DeviceContext& context = DeviceContext::Get(Device::CUDA(0));
  auto side = context.CreateSideStream();
  Tensor t = Tensor::Empty({1 << 20}, DType::kF32, Device::CUDA(0));
  void* first = t.data();
  StreamBlocker blocker(*side);
  side->CopyAsync(t.data(), t.data(), 16);  // queued behind the blocker: still "reading"
  t.RecordStream(*side);
  t = Tensor();  // freed on the compute stream while the side stream still needs it
  Tensor during = Tensor::Empty({1 << 20}, DType::kF32, Device::CUDA(0));
  EXPECT_NE(during.data(), first) << "block reused before the side stream finished";
  blocker.Release();
  side->Synchronize();
  // `during` is still alive, so only the first block can serve a request of this size.
  Tensor after = Tensor::Empty({1 << 20}, DType::kF32, Device::CUDA(0));
  EXPECT_EQ(after.data(), first) << "block not reused after the side stream finished";
}

TEST_F(CudaRuntimeTest, AllocatorStatsCountDeviceBytes) {
  CachingAllocator& allocator = DeviceContext::Get(Device::CUDA(0)).allocator();
  const MemoryStats before = allocator.stats();
  {
    Tensor t = Tensor::Empty({3, 1000}, DType::kBF16, Device::CUDA(0));  // 6000 -> 6144 bytes
    EXPECT_EQ(allocator.stats().allocated_bytes - before.allocated_bytes, 6144);
  }
  EXPECT_EQ(allocator.stats().allocated_bytes, before.allocated_bytes);
}

}  // namespace
}  // namespace moe
