// Pinned (page-locked) host memory for offloaded activations.
//
// Pooled allocations round up to a size class (a power of two, at least 4 KiB); released blocks
// go back to their class's free list and are handed out again (a hit) instead of being pinned
// anew (a miss). Pinning is slow, so the pool never gives memory back while it lives.
// Unpooled allocations (for tensors whose shapes change every step, e.g. routed expert
// activations) are pinned on demand and unpinned when released.
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
  int64_t unpooled_in_use_bytes = 0;
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
  std::vector<void*> owned_;                          // every pooled block, freed at destruction
};

}  // namespace moe
