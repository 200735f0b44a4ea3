#include "engine/memory/caching_allocator.h"

#include <algorithm>

#include <glog/logging.h>

#include "engine/core/byte_units.h"

namespace moe {

// A cached block serves a request of `size` bytes if it is at most size / kMaxSlackDivisor larger.
constexpr size_t kMaxSlackDivisor = 8;

struct CachingAllocator::Block {
  void* ptr = nullptr;
  size_t size = 0;                                     // rounded size, as counted in the stats
  Stream* stream = nullptr;                            // the stream it was allocated on
  std::vector<Stream*> used_on;                        // other streams recorded by RecordStream
  std::vector<std::unique_ptr<Event>> pending_events;  // recorded at free time
};

std::string MemoryStats::ToString() const {
  char buffer[256];
  snprintf(buffer, sizeof(buffer),
           "allocated %.1f MiB (peak %.1f), reserved %.1f MiB (peak %.1f), %lld allocations, "
           "%lld cache hits",
           allocated_bytes / kMiB, peak_allocated_bytes / kMiB, reserved_bytes / kMiB,
           peak_reserved_bytes / kMiB, static_cast<long long>(num_allocations),
           static_cast<long long>(num_cache_hits));
  return buffer;
}

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<RawMemory> raw)
    : device_(device), raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  ProcessPendingFrees(/*wait=*/true);
  ReleaseCachedBlocks();
}

std::shared_ptr<Storage> CachingAllocator::Allocate(size_t bytes, Stream& stream) {
  CHECK(stream.device() == device_) << "allocation for " << device_.ToString() << " on a stream of "
                                    << stream.device().ToString();
  const size_t size =
      std::max<size_t>(kRoundBytes, (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes);
  Block* block = nullptr;
  std::string out_of_memory;  // set when the source is exhausted
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.num_allocations;
    ProcessPendingFrees(/*wait=*/false);  // frees whose streams are done stop counting here
    block = TakeCachedBlock(size, &stream);
    if (block != nullptr) {
      ++stats_.num_cache_hits;
    } else {
      void* ptr = raw_->Allocate(size);
      if (ptr == nullptr) {  // out: wait for pending frees, return every cached block, retry
        ProcessPendingFrees(/*wait=*/true);
        ReleaseCachedBlocks();
        ptr = raw_->Allocate(size);
      }
      if (ptr == nullptr) {
        out_of_memory = "out of " + device_.ToString() + " memory allocating " +
                        std::to_string(bytes) + " bytes: " + stats_.ToString();
      } else {
        block = new Block{ptr, size, &stream, {}, {}};
        ++stats_.num_raw_allocations;
        stats_.reserved_bytes += size;
        stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
      }
    }
    if (block != nullptr) {
      stats_.allocated_bytes += block->size;  // what Free subtracts: a cached block may be larger
      stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    }
  }
  if (block == nullptr) ReportOutOfMemory(out_of_memory);  // outside the lock
  return std::make_shared<Storage>(
      block->ptr, bytes, device_, MemorySpace::kDevice, [this, block] { Free(block); },
      [this, block](Stream& other) { RecordStream(block, other); });
}

CachingAllocator::Block* CachingAllocator::TakeCachedBlock(size_t size, Stream* stream) {
  auto pool = free_blocks_.find(stream);
  if (pool == free_blocks_.end()) return nullptr;
  auto it = pool->second.lower_bound(size);
  if (it == pool->second.end() || it->first > size + size / kMaxSlackDivisor) return nullptr;
  Block* block = it->second;
  pool->second.erase(it);
  return block;
}

void CachingAllocator::RecordStream(Block* block, Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (&stream == block->stream) return;
  if (std::find(block->used_on.begin(), block->used_on.end(), &stream) == block->used_on.end()) {
    block->used_on.push_back(&stream);
  }
}

void CachingAllocator::Free(Block* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (block->used_on.empty()) {
    stats_.allocated_bytes -= block->size;
    free_blocks_[block->stream].emplace(block->size, block);
    return;
  }
  for (Stream* stream : block->used_on) {
    std::unique_ptr<Event> event = stream->CreateEvent();
    event->Record(*stream);
    block->pending_events.push_back(std::move(event));
  }
  block->used_on.clear();
  pending_frees_.push_back(block);
}

void CachingAllocator::ProcessPendingFrees(bool wait) {
  auto ready = [wait](Block* block) {
    for (auto& event : block->pending_events) {
      if (wait) {
        event->Synchronize();
      } else if (!event->Query()) {
        return false;
      }
    }
    return true;
  };
  // Runs on every allocation: in place, nothing allocated.
  const auto released = [&](Block* block) {
    if (!ready(block)) return false;
    block->pending_events.clear();
    stats_.allocated_bytes -= block->size;
    free_blocks_[block->stream].emplace(block->size, block);
    return true;
  };
  pending_frees_.erase(std::remove_if(pending_frees_.begin(), pending_frees_.end(), released),
                       pending_frees_.end());
}

void CachingAllocator::ReleaseCachedBlocks() {
  for (auto& [stream, pool] : free_blocks_) {
    for (auto& [size, block] : pool) {
      raw_->Free(block->ptr);
      stats_.reserved_bytes -= block->size;
      delete block;
    }
  }
  free_blocks_.clear();
}

MemoryStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  ProcessPendingFrees(/*wait=*/false);
  return stats_;
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  ProcessPendingFrees(/*wait=*/false);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  ProcessPendingFrees(/*wait=*/true);
  ReleaseCachedBlocks();
}

}  // namespace moe
