// Pinned (page-locked) host memory for offloaded activations.
//
// Pooled allocations round up to a size class (a power of two, at least 4 KiB); released blocks
// go back to their class's free list and are handed out again (a hit) instead of being pinned
// anew (a miss). Pinning is slow, so the pool never gives memory back while it lives.
// Unpooled allocations (for tensors whose shapes change every step, e.g. routed expert
// activations) skip the size classes, whose power-of-two rounding would waste up to half of
// each buffer: they come from a separate cache of buffers pinned with a 25% margin over the
// request. A released buffer is handed out again to a request it fits (Fits: within 2x, or no
// larger than the request would pin); a request that fits none pins a new buffer and unpins the
// cached ones too small for it, so the cache follows the routed sizes without pinning (slow, and
// synchronising on CUDA) every step.
//
// The caller orders reuse: a block must not be released while a copy stream still uses it.
// Out of pinned memory is reported through ReportOutOfMemory (out_of_memory.h), one line.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/storage.h"
#include "engine/memory/raw_memory.h"

namespace moe {

struct PinnedPoolStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t pooled_reserved_bytes = 0;  // pinned by the pool (in use + free lists)
  int64_t pooled_in_use_bytes = 0;
  int64_t unpooled_in_use_bytes = 0;    // requested bytes of live unpooled allocations
  int64_t unpooled_reserved_bytes = 0;  // pinned for unpooled use (in use + cached)
  int64_t unpooled_pins = 0;            // unpooled requests that had to pin a new buffer
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
  // Pins ahead of use (e.g. before a planned first step, whose copies would otherwise wait for
  // pinning): free blocks for `pooled` requests held at once, and cached buffers for `unpooled`
  // ones, so that those requests then hit. What is already free counts; pins count as misses.
  void Reserve(const std::vector<size_t>& pooled, std::vector<size_t> unpooled);

  PinnedPoolStats stats() const;
  static size_t SizeClass(size_t bytes);
  // What an unpooled request of `bytes` pins: 25% more, in 64 KiB granules.
  static size_t UnpooledCapacity(size_t bytes);
  // Whether a cached unpooled buffer of `capacity` is handed to a request of `bytes`: it holds
  // it, within 2x or what the request would pin itself.
  static bool Fits(size_t capacity, size_t bytes);

  static constexpr size_t kMinClassBytes = 4096;

 private:
  const Device device_;
  std::unique_ptr<RawMemory> raw_;
  mutable std::mutex mutex_;
  PinnedPoolStats stats_;
  std::map<size_t, std::vector<void*>> free_lists_;  // size class -> free blocks
  std::multimap<size_t, void*> unpooled_free_;       // capacity -> cached unpooled buffer
  std::vector<void*> owned_;                         // every pooled block, freed at destruction

  // Under mutex_; nullptr when the raw source is out (the caller reports OutOfMemoryLine after
  // unlocking).
  void* PinPooled(size_t size_class);
  void* PinUnpooled(size_t capacity);
  std::string ReserveLocked(const std::vector<size_t>& pooled, std::vector<size_t> unpooled);
  std::string OutOfMemoryLine(size_t bytes) const;
};

}  // namespace moe
