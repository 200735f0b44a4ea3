// Caching allocator on the CPU backend's device arena: reuse, stream safety, stats.
#include "engine/memory/caching_allocator.h"

#include <gtest/gtest.h>

#include "engine/runtime/cpu_stream.h"

namespace moe {
namespace {

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CpuStream compute_{CpuStream::Mode::kInline};
  CpuStream copy_{CpuStream::Mode::kWorker};
  CachingAllocator allocator_{Device::CPU(), NewHostRawMemory()};
};

TEST_F(CachingAllocatorTest, FreedBlockIsReusedOnTheSameStream) {
  void* first;
  {
    auto storage = allocator_.Allocate(1000, compute_);
    first = storage->data();
  }
  auto again = allocator_.Allocate(1000, compute_);
  EXPECT_EQ(again->data(), first);
  const MemoryStats stats = allocator_.stats();
  EXPECT_EQ(stats.num_allocations, 2);
  EXPECT_EQ(stats.num_cache_hits, 1);
  EXPECT_EQ(stats.num_raw_allocations, 1);
}

TEST_F(CachingAllocatorTest, BlocksAreNotSharedAcrossStreams) {
  void* first;
  {
    auto storage = allocator_.Allocate(4096, compute_);
    first = storage->data();
  }
  auto other = allocator_.Allocate(4096, copy_);
  EXPECT_NE(other->data(), first);
}

TEST_F(CachingAllocatorTest, StatsTrackCurrentPeakAndReserved) {
  {
    auto a = allocator_.Allocate(1, compute_);      // rounds to 512
    auto b = allocator_.Allocate(10000, compute_);  // rounds to 10240
    EXPECT_EQ(allocator_.stats().allocated_bytes, 512 + 10240);
  }
  MemoryStats stats = allocator_.stats();
  EXPECT_EQ(stats.allocated_bytes, 0);
  EXPECT_EQ(stats.peak_allocated_bytes, 512 + 10240);
  EXPECT_EQ(stats.reserved_bytes, 512 + 10240);
  allocator_.ResetPeakStats();
  EXPECT_EQ(allocator_.stats().peak_allocated_bytes, 0);
  allocator_.EmptyCache();
  EXPECT_EQ(allocator_.stats().reserved_bytes, 0);
}

TEST_F(CachingAllocatorTest, SmallRequestsDoNotTakeMuchLargerBlocks) {
  void* big;
  {
    auto storage = allocator_.Allocate(1 << 20, compute_);
    big = storage->data();
  }
  auto small = allocator_.Allocate(1000, compute_);
  EXPECT_NE(small->data(), big);
}

TEST_F(CachingAllocatorTest, CachedBlockServesRequestsUpToAnEighthSmaller) {
  void* block;
  {
    auto storage = allocator_.Allocate(9 * 512, compute_);
    block = storage->data();
  }
  auto too_small = allocator_.Allocate(7 * 512, compute_);  // 9/7 > 1 + 1/8
  EXPECT_NE(too_small->data(), block);
  auto fits = allocator_.Allocate(8 * 512, compute_);  // 9/8
  EXPECT_EQ(fits->data(), block);
}

// A block read by a copy stream must not be handed out again before that copy has finished,
// even though the tensor was freed on the compute stream at once; until then it holds memory
// and counts as allocated.
TEST_F(CachingAllocatorTest, BlockUsedOnAnotherStreamWaitsForThatStream) {
  SetCpuCopyLatencyForTesting(std::chrono::milliseconds(200));
  std::vector<char> host(4096);
  void* first;
  const int64_t before = allocator_.stats().allocated_bytes;
  {
    auto storage = allocator_.Allocate(4096, compute_);
    first = storage->data();
    copy_.CopyAsync(host.data(), storage->data(), 4096);  // still sleeping on the worker
    storage->RecordStream(copy_);
  }
  EXPECT_EQ(allocator_.stats().allocated_bytes, before + 4096) << "pending free not counted";
  auto during = allocator_.Allocate(4096, compute_);
  EXPECT_NE(during->data(), first) << "block reused while the copy stream still reads it";
  EXPECT_EQ(allocator_.stats().peak_allocated_bytes, before + 2 * 4096);
  copy_.Synchronize();
  EXPECT_EQ(allocator_.stats().allocated_bytes, before + 4096) << "done copy still counted";
  auto after = allocator_.Allocate(4096, compute_);
  EXPECT_EQ(after->data(), first) << "block not reused once the copy finished";
  SetCpuCopyLatencyForTesting(std::chrono::microseconds(0));
}

}  // namespace
}  // namespace moe
