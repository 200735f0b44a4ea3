// Out of memory in the engine's allocators (out_of_memory.h): the caching allocator with no
// handler fails fatally naming the device and the request; with the app's handler, the handler
// gets that one line, outside the allocator's lock (it may read the allocator's stats), and ends
// the process its way. The pinned host pool reports the same way, when pinning on demand and
// when reserving. The raw sources report a capacity (physical memory for the CPU backend).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>

#include "engine/memory/caching_allocator.h"
#include "engine/memory/pinned_host_pool.h"
#include "engine/runtime/cpu_stream.h"

namespace moe {
namespace {

// A raw source that holds `capacity` bytes in all.
class SmallRawMemory final : public RawMemory {
 public:
  explicit SmallRawMemory(size_t capacity) : capacity_(capacity) {}
  void* Allocate(size_t bytes) override {
    if (used_ + bytes > capacity_) return nullptr;
    used_ += bytes;
    return host_->Allocate(bytes);
  }
  void Free(void* ptr) override { host_->Free(ptr); }  // (used_ is not given back: a test)
  size_t CapacityBytes() const override { return capacity_; }

 private:
  size_t capacity_;
  size_t used_ = 0;
  std::unique_ptr<RawMemory> host_ = NewHostRawMemory();
};

// What the handler reads of the failing allocator: its stats() take its lock, so this would
// deadlock if the handler ran under it. Set by each test.
std::function<std::string()> read_stats;

[[noreturn]] void ReportAndExit(const std::string& message) {
  fprintf(stderr, "handled: %s | still readable: %s\n", message.c_str(), read_stats().c_str());
  fflush(stderr);
  _exit(3);
}

TEST(CachingAllocatorOomDeathTest, WithoutAHandlerTheFailureIsACheck) {
  CpuStream stream(CpuStream::Mode::kInline);
  CachingAllocator allocator(Device::CPU(), std::make_unique<SmallRawMemory>(4096));
  EXPECT_DEATH(allocator.Allocate(8192, stream), "out of cpu memory allocating 8192 bytes");
}

TEST(CachingAllocatorOomDeathTest, TheHandlerGetsOneLineOutsideTheLock) {
  CpuStream stream(CpuStream::Mode::kInline);
  CachingAllocator allocator(Device::CPU(), std::make_unique<SmallRawMemory>(4096));
  auto fits = allocator.Allocate(2048, stream);
  EXPECT_EXIT(
      {
        read_stats = [&] {
          return std::to_string(allocator.stats().num_allocations) + " allocations";
        };
        SetOutOfMemoryHandler(&ReportAndExit);
        allocator.Allocate(4096, stream);
      },
      ::testing::ExitedWithCode(3),
      "handled: out of cpu memory allocating 4096 bytes: allocated .*, 2 allocations, 0 cache "
      "hits \\| still readable: 2 allocations");
  EXPECT_EQ(SetOutOfMemoryHandler(nullptr), nullptr) << "the handler was set in the child only";
}

TEST(PinnedHostPoolOomDeathTest, PinningBeyondTheSourceIsOneLineToTheHandler) {
  PinnedHostPool pool(Device::CPU(), std::make_unique<SmallRawMemory>(1 << 20));
  auto fits = pool.Allocate(4096);
  read_stats = [&] { return std::to_string(pool.stats().misses) + " misses"; };
  EXPECT_EXIT(
      {
        SetOutOfMemoryHandler(&ReportAndExit);
        pool.Allocate(2 << 20);
      },
      ::testing::ExitedWithCode(3),
      "handled: out of pinned host memory pinning 2097152 bytes \\(pinned already: 4096 bytes\\) "
      "for offloaded activations \\| still readable: 1 misses");
  EXPECT_EXIT(
      {
        SetOutOfMemoryHandler(&ReportAndExit);
        pool.AllocateUnpooled(3 << 20);
      },
      ::testing::ExitedWithCode(3), "handled: out of pinned host memory pinning 3932160 bytes");
  EXPECT_EXIT(
      {
        SetOutOfMemoryHandler(&ReportAndExit);
        pool.Reserve({4096, 4096, 1 << 19}, {1 << 19});
      },
      ::testing::ExitedWithCode(3), "handled: out of pinned host memory pinning 6[0-9]+ bytes");
}

TEST(CachingAllocatorOomTest, SourcesReportTheirCapacity) {
  EXPECT_EQ(
      CachingAllocator(Device::CPU(), std::make_unique<SmallRawMemory>(4096)).capacity_bytes(),
      4096u);
  const size_t physical = CachingAllocator(Device::CPU(), NewHostRawMemory()).capacity_bytes();
  EXPECT_GT(physical, size_t{256} << 20);
  EXPECT_EQ(physical % static_cast<size_t>(sysconf(_SC_PAGE_SIZE)), 0u);
}

}  // namespace
}  // namespace moe
