// Pinned host pool: size classes, reuse (hits), misses, and the unpooled path.
#include "engine/memory/pinned_host_pool.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace moe {
namespace {

TEST(PinnedHostPoolTest, SizeClassesArePowersOfTwoFromFourKiB) {
  EXPECT_EQ(PinnedHostPool::SizeClass(1), 4096u);
  EXPECT_EQ(PinnedHostPool::SizeClass(4096), 4096u);
  EXPECT_EQ(PinnedHostPool::SizeClass(4097), 8192u);
  EXPECT_EQ(PinnedHostPool::SizeClass(3u << 20), 4u << 20);
}

TEST(PinnedHostPoolTest, ReleasedBlocksAreReusedWithinTheirClass) {
  PinnedHostPool pool(Device::CPU(), NewHostRawMemory());
  void* first;
  {
    auto a = pool.Allocate(5000);
    first = a->data();
    EXPECT_EQ(pool.stats().pooled_in_use_bytes, 8192);
  }
  auto b = pool.Allocate(6000);  // same 8 KiB class
  EXPECT_EQ(b->data(), first);
  auto c = pool.Allocate(6000);  // class empty again: a miss
  EXPECT_NE(c->data(), first);
  const PinnedPoolStats stats = pool.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.pooled_reserved_bytes, 2 * 8192);
  EXPECT_EQ(stats.pooled_in_use_bytes, 2 * 8192);
  EXPECT_EQ(b->space(), MemorySpace::kPinnedHost);
}

TEST(PinnedHostPoolTest, RepeatedStepsDoNotGrowThePool) {
  PinnedHostPool pool(Device::CPU(), NewHostRawMemory());
  for (int step = 0; step < 50; ++step) {
    auto a = pool.Allocate(100000);
    auto b = pool.Allocate(3000);
  }
  const PinnedPoolStats stats = pool.stats();
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.hits, 98);
  EXPECT_EQ(stats.pooled_reserved_bytes, 131072 + 4096);
}

TEST(PinnedHostPoolTest, UnpooledMemoryBypassesTheSizeClasses) {
  PinnedHostPool pool(Device::CPU(), NewHostRawMemory());
  {
    auto a = pool.AllocateUnpooled(12345);
    EXPECT_EQ(pool.stats().unpooled_in_use_bytes, 12345);
  }
  const PinnedPoolStats stats = pool.stats();
  EXPECT_EQ(stats.unpooled_in_use_bytes, 0);
  EXPECT_EQ(stats.peak_unpooled_in_use_bytes, 12345);
  EXPECT_EQ(stats.unpooled_allocations, 1);
  EXPECT_EQ(stats.unpooled_pins, 1);
  EXPECT_EQ(stats.hits + stats.misses, 0);
  EXPECT_EQ(stats.pooled_reserved_bytes, 0);
}

// Routed sizes change every step: buffers are reused while they fit, and the cache follows
// growing sizes without keeping the outgrown buffers.
TEST(PinnedHostPoolTest, UnpooledBuffersFollowChangingSizes) {
  PinnedHostPool pool(Device::CPU(), NewHostRawMemory());
  void* first;
  {
    auto a = pool.AllocateUnpooled(100000);
    first = a->data();
  }
  {
    auto b = pool.AllocateUnpooled(110000);  // within the 25% margin: the same buffer
    EXPECT_EQ(b->data(), first);
    auto c = pool.AllocateUnpooled(90000);  // the cached one is busy: a new pin
    EXPECT_NE(c->data(), first);
  }
  EXPECT_EQ(pool.stats().unpooled_pins, 2);
  for (int step = 0; step < 50; ++step) {
    auto a = pool.AllocateUnpooled(95000 + 300 * step);
    auto b = pool.AllocateUnpooled(105000 - 200 * step);
  }
  const PinnedPoolStats stats = pool.stats();
  EXPECT_EQ(stats.unpooled_in_use_bytes, 0);
  EXPECT_LE(stats.unpooled_pins, 4) << "pinned anew although cached buffers fit";
  EXPECT_LE(stats.unpooled_reserved_bytes, 2 * 160 * 1024) << "outgrown buffers were kept";
  {
    auto big = pool.AllocateUnpooled(1 << 20);  // fits nothing: the smaller buffers are unpinned
  }
  EXPECT_EQ(pool.stats().unpooled_reserved_bytes, (((1 << 20) * 5 / 4) + 65535) / 65536 * 65536);
}

// A small routed tensor (its pinned buffer is a whole 64 KiB granule, more than 2x) reuses its
// buffer every step instead of pinning another.
TEST(PinnedHostPoolTest, SmallUnpooledBuffersAreReused) {
  PinnedHostPool pool(Device::CPU(), NewHostRawMemory());
  for (int step = 0; step < 5; ++step) pool.AllocateUnpooled(8192 + step);
  EXPECT_EQ(pool.stats().unpooled_pins, 1);
  EXPECT_EQ(pool.stats().unpooled_reserved_bytes, 65536);
}

// Reserved ahead, the requests held at once all hit; what is already free counts toward a
// reservation, so reserving again pins nothing.
TEST(PinnedHostPoolTest, ReservedRequestsHitWithoutPinning) {
  PinnedHostPool pool(Device::CPU(), NewHostRawMemory());
  const std::vector<size_t> pooled = {5000, 6000, 100000}, unpooled = {300000, 70000};
  pool.Reserve(pooled, unpooled);
  const PinnedPoolStats reserved = pool.stats();
  EXPECT_EQ(reserved.misses, 3);
  EXPECT_EQ(reserved.unpooled_pins, 2);
  EXPECT_EQ(reserved.pooled_in_use_bytes, 0);
  EXPECT_EQ(reserved.pooled_reserved_bytes, 2 * 8192 + 131072);
  EXPECT_EQ(reserved.unpooled_reserved_bytes,
            static_cast<int64_t>(PinnedHostPool::UnpooledCapacity(300000) +
                                 PinnedHostPool::UnpooledCapacity(70000)));
  pool.Reserve(pooled, unpooled);
  EXPECT_EQ(pool.stats().misses, 3);
  EXPECT_EQ(pool.stats().unpooled_pins, 2);
  {
    std::vector<std::shared_ptr<Storage>> held;
    for (size_t bytes : pooled) held.push_back(pool.Allocate(bytes));
    for (size_t bytes : unpooled) held.push_back(pool.AllocateUnpooled(bytes));
    const PinnedPoolStats used = pool.stats();
    EXPECT_EQ(used.hits, 3);
    EXPECT_EQ(used.misses, 3);
    EXPECT_EQ(used.unpooled_pins, 2);
    EXPECT_EQ(used.unpooled_in_use_bytes, 370000);
  }
  std::vector<std::shared_ptr<Storage>> more;  // its class holds two reserved blocks
  for (int i = 0; i < 3; ++i) more.push_back(pool.Allocate(5000));
  EXPECT_EQ(pool.stats().misses, 4);
}

}  // namespace
}  // namespace moe
