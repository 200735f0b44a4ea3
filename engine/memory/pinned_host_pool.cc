#include "engine/memory/pinned_host_pool.h"

#include <algorithm>
#include <bit>

#include <glog/logging.h>

#include "engine/memory/out_of_memory.h"

namespace moe {

PinnedHostPool::PinnedHostPool(Device device, std::unique_ptr<RawMemory> raw)
    : device_(device), raw_(std::move(raw)) {}

PinnedHostPool::~PinnedHostPool() {
  for (void* ptr : owned_) raw_->Free(ptr);
  for (auto& [capacity, ptr] : unpooled_free_) raw_->Free(ptr);
}

size_t PinnedHostPool::SizeClass(size_t bytes) {
  return std::bit_ceil(std::max(bytes, kMinClassBytes));
}

std::shared_ptr<Storage> PinnedHostPool::Allocate(size_t bytes) {
  const size_t size_class = SizeClass(bytes);
  void* ptr = nullptr;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<void*>& free_list = free_lists_[size_class];
    if (!free_list.empty()) {
      ptr = free_list.back();
      free_list.pop_back();
      ++stats_.hits;
    } else {
      ptr = PinPooled(size_class);
      if (ptr == nullptr) failure = OutOfMemoryLine(size_class);
    }
    if (ptr != nullptr) stats_.pooled_in_use_bytes += size_class;
  }
  if (ptr == nullptr) ReportOutOfMemory(failure);  // outside the lock
  return std::make_shared<Storage>(ptr, bytes, device_, MemorySpace::kPinnedHost,
                                   [this, ptr, size_class] {
                                     std::lock_guard<std::mutex> lock(mutex_);
                                     free_lists_[size_class].push_back(ptr);
                                     stats_.pooled_in_use_bytes -= size_class;
                                   });
}

std::shared_ptr<Storage> PinnedHostPool::AllocateUnpooled(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  void* ptr = nullptr;
  size_t capacity = 0;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.unpooled_allocations;
    auto fit = unpooled_free_.lower_bound(bytes);
    if (fit != unpooled_free_.end() && Fits(fit->first, bytes)) {
      capacity = fit->first;
      ptr = fit->second;
      unpooled_free_.erase(fit);
    } else {
      for (auto it = unpooled_free_.begin(); it != unpooled_free_.end() && it->first < bytes;) {
        raw_->Free(it->second);
        stats_.unpooled_reserved_bytes -= static_cast<int64_t>(it->first);
        it = unpooled_free_.erase(it);
      }
      capacity = UnpooledCapacity(bytes);
      ptr = PinUnpooled(capacity);
      if (ptr == nullptr) failure = OutOfMemoryLine(capacity);
    }
    if (ptr != nullptr) stats_.unpooled_in_use_bytes += static_cast<int64_t>(bytes);
    stats_.peak_unpooled_in_use_bytes =
        std::max(stats_.peak_unpooled_in_use_bytes, stats_.unpooled_in_use_bytes);
  }
  if (ptr == nullptr) ReportOutOfMemory(failure);  // outside the lock
  return std::make_shared<Storage>(ptr, bytes, device_, MemorySpace::kPinnedHost,
                                   [this, ptr, bytes, capacity] {
                                     std::lock_guard<std::mutex> lock(mutex_);
                                     unpooled_free_.emplace(capacity, ptr);
                                     stats_.unpooled_in_use_bytes -= static_cast<int64_t>(bytes);
                                   });
}

size_t PinnedHostPool::UnpooledCapacity(size_t bytes) {
  constexpr size_t kGranule = 64 * 1024;
  return (bytes + bytes / 4 + kGranule - 1) / kGranule * kGranule;
}

bool PinnedHostPool::Fits(size_t capacity, size_t bytes) {
  return capacity >= bytes && capacity <= std::max(2 * bytes, UnpooledCapacity(bytes));
}

std::string PinnedHostPool::OutOfMemoryLine(size_t bytes) const {
  return "out of pinned host memory pinning " + std::to_string(bytes) + " bytes (pinned already: " +
         std::to_string(stats_.pooled_reserved_bytes + stats_.unpooled_reserved_bytes) +
         " bytes) for offloaded activations";
}

void* PinnedHostPool::PinUnpooled(size_t capacity) {
  void* ptr = raw_->Allocate(capacity);
  if (ptr == nullptr) return nullptr;
  ++stats_.unpooled_pins;
  stats_.unpooled_reserved_bytes += static_cast<int64_t>(capacity);
  return ptr;
}

void* PinnedHostPool::PinPooled(size_t size_class) {
  void* ptr = raw_->Allocate(size_class);
  if (ptr == nullptr) return nullptr;
  owned_.push_back(ptr);
  ++stats_.misses;
  stats_.pooled_reserved_bytes += static_cast<int64_t>(size_class);
  return ptr;
}

void PinnedHostPool::Reserve(const std::vector<size_t>& pooled, std::vector<size_t> unpooled) {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure = ReserveLocked(pooled, std::move(unpooled));
  }
  if (!failure.empty()) ReportOutOfMemory(failure);  // outside the lock
}

std::string PinnedHostPool::ReserveLocked(const std::vector<size_t>& pooled,
                                          std::vector<size_t> unpooled) {
  std::map<size_t, size_t> wanted;  // size class -> blocks
  for (size_t bytes : pooled) ++wanted[SizeClass(bytes)];
  for (const auto& [size_class, count] : wanted) {
    std::vector<void*>& free_list = free_lists_[size_class];
    while (free_list.size() < count) {
      void* ptr = PinPooled(size_class);
      if (ptr == nullptr) return OutOfMemoryLine(size_class);
      free_list.push_back(ptr);
    }
  }
  // Largest first, each matched to a cached buffer it would be handed (AllocateUnpooled's rule)
  // and not yet matched; the rest pin.
  std::sort(unpooled.rbegin(), unpooled.rend());
  std::multimap<size_t, void*> unmatched = unpooled_free_;
  for (size_t bytes : unpooled) {
    bytes = std::max<size_t>(bytes, 1);
    const auto fit = unmatched.lower_bound(bytes);
    if (fit != unmatched.end() && Fits(fit->first, bytes)) {
      unmatched.erase(fit);
      continue;
    }
    const size_t capacity = UnpooledCapacity(bytes);
    void* ptr = PinUnpooled(capacity);
    if (ptr == nullptr) return OutOfMemoryLine(capacity);
    unpooled_free_.emplace(capacity, ptr);
  }
  return "";
}

PinnedPoolStats PinnedHostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace moe
