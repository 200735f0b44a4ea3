// Pinned (page-locked) host memory for offloaded activations.
//
// Pooled allocations round up to a size class (a power of two, at least 4 KiB); released blocks
// go back to their class's free list and are handed out again (a hit) instead of being pinned
// anew (a miss). Pinning is slow, so the pool never gives memory back while it lives.
// Unpooled allocations (for tensors whose shapes change every step, e.g. routed expert
// activations) skip the size classes, whose power-of-two rounding would waste up to half of
// each buffer: they come from a separate cache of buffers pinned with a 25% margin over the
// request. A released buffer is handed out again to a request it fits within 2x; a request that
// fits none pins a new buffer and unpins the cached ones too small for it, so the cache follows
// the routed sizes without pinning (slow, and synchronising on CUDA) every step.
//
// The caller orders reuse: a block must not be released while a copy stream still uses it.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/storage.h"
#include "engine/memory/raw_memory.h"

namespace moe {

struct PinnedPoolStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t pooled_reserved_bytes = 0;    // pinned by the pool (in use + free lists)
  int64_t pooled_in_use_bytes = 0;
  int64_t unpooled_in_use_bytes = 0;     // requested bytes of live unpooled allocations
  int64_t unpooled_reserved_bytes = 0;   // pinned for unpooled use (in use + cached)
  int64_t unpooled_pins = 0;             // unpooled requests that had to pin a new buffer
  int64_t peak_unpooled_in_use_bytes = 0;
  int64_t unpooled_allocations = 0;
};

class PinnedHostPool {
 public:
  // `device` is the backend the memory is pinned for (CPU or CUDA:n).
  PinnedHostPool(Device device, std::unique_ptr<RawMemory> raw);
  ~PinnedHostPool();

  std::shared_ptr<Storage> Allocate(size_t bytes);
  std::shared_ptr<Storage> AllocateUnpooled(size_t bytes);

  PinnedPoolStats stats() const;
  static size_t SizeClass(size_t bytes);

  static constexpr size_t kMinClassBytes = 4096;

 private:
  const Device device_;
  std::unique_ptr<RawMemory> raw_;
  mutable std::mutex mutex_;
  PinnedPoolStats stats_;
  std::map<size_t, std::vector<void*>> free_lists_;  // size class -> free blocks
  std::multimap<size_t, void*> unpooled_free_;        // capacity -> cached unpooled buffer
  std::vector<void*> owned_;                          // every pooled block, freed at destruction
};

}  // namespace moe
