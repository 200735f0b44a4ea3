#include "engine/memory/pinned_host_pool.h"

#include <algorithm>
#include <bit>

#include <glog/logging.h>

namespace moe {

PinnedHostPool::PinnedHostPool(Device device, std::unique_ptr<RawMemory> raw)
    : device_(device), raw_(std::move(raw)) {}

PinnedHostPool::~PinnedHostPool() {
  for (void* ptr : owned_) raw_->Free(ptr);
}

size_t PinnedHostPool::SizeClass(size_t bytes) {
  return std::bit_ceil(std::max(bytes, kMinClassBytes));
}

std::shared_ptr<Storage> PinnedHostPool::Allocate(size_t bytes) {
  const size_t size_class = SizeClass(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<void*>& free_list = free_lists_[size_class];
    if (!free_list.empty()) {
      ptr = free_list.back();
      free_list.pop_back();
      ++stats_.hits;
    } else {
      ptr = raw_->Allocate(size_class);
      CHECK(ptr != nullptr) << "out of pinned host memory allocating " << size_class << " bytes";
      owned_.push_back(ptr);
      ++stats_.misses;
      stats_.pooled_reserved_bytes += size_class;
    }
    stats_.pooled_in_use_bytes += size_class;
  }
  return std::make_shared<Storage>(ptr, bytes, device_, MemorySpace::kPinnedHost,
                                   [this, ptr, size_class] {
                                     std::lock_guard<std::mutex> lock(mutex_);
                                     free_lists_[size_class].push_back(ptr);
                                     stats_.pooled_in_use_bytes -= size_class;
                                   });
}

std::shared_ptr<Storage> PinnedHostPool::AllocateUnpooled(size_t bytes) {
  void* ptr = raw_->Allocate(std::max<size_t>(bytes, 1));
  CHECK(ptr != nullptr) << "out of pinned host memory allocating " << bytes << " bytes";
  const auto size = static_cast<int64_t>(bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.unpooled_allocations;
    stats_.unpooled_in_use_bytes += size;
    stats_.peak_unpooled_in_use_bytes =
        std::max(stats_.peak_unpooled_in_use_bytes, stats_.unpooled_in_use_bytes);
  }
  return std::make_shared<Storage>(ptr, bytes, device_, MemorySpace::kPinnedHost,
                                   [this, ptr, size] {
                                     raw_->Free(ptr);
                                     std::lock_guard<std::mutex> lock(mutex_);
                                     stats_.unpooled_in_use_bytes -= size;
                                   });
}

PinnedPoolStats PinnedHostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace moe
