// Stream-ordered caching allocator for device memory (CUDA, and the CPU backend's device arena).
//
// Design (after PyTorch's CUDACachingAllocator, much reduced):
// - Sizes round up to 512 bytes. Freed blocks are cached, never returned to the raw source
//   except by EmptyCache or when the source runs out.
// - Every block belongs to the stream it was allocated on. Freeing it makes it reusable at once
//   for later allocations on that same stream: stream order guarantees the old user is done.
// - If the block was also used on other streams (RecordStream), freeing records an event on each
//   of them; the block is reused only after all those events have completed. This is what lets
//   the offload manager free a tensor on the compute stream while a D2H copy still reads it.
//   Such a block still counts as allocated (it holds device memory) until its events have
//   completed, as PyTorch counts it; each allocation first polls the pending frees.
// - Allocation takes the smallest cached block of the same stream that fits and is at most an
//   eighth larger than the request (blocks are not split, so a looser fit holds memory no tensor
//   uses). On a miss it asks the raw source, then synchronises pending frees and empties the
//   cache once before failing.
// - Out of memory is a user error: the allocator reports it through ReportOutOfMemory
//   (out_of_memory.h), outside its lock, with one line ("out of cuda:0 memory allocating
//   2147483648 bytes: allocated ..., reserved ...").
//
// Thread-safe: tensors may be freed from any thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/storage.h"
#include "engine/core/stream.h"
#include "engine/memory/memory_stats.h"
#include "engine/memory/out_of_memory.h"
#include "engine/memory/raw_memory.h"

namespace moe {

class CachingAllocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<RawMemory> raw);
  ~CachingAllocator();

  // Memory ordered on `stream`. If the source is exhausted: the out-of-memory handler, else a
  // CHECK failure with the allocator's stats.
  std::shared_ptr<Storage> Allocate(size_t bytes, Stream& stream);
  // What the raw source can hold at most (device total memory, or physical memory for the CPU
  // backend's arena); 0 if unknown.
  size_t capacity_bytes() const { return raw_->CapacityBytes(); }

  // The counters now: pending frees whose streams are done stop counting first.
  MemoryStats stats();
  void ResetPeakStats();
  // Returns every cached, unused block to the raw source (waits for pending frees first).
  void EmptyCache();

  static constexpr size_t kRoundBytes = 512;

 private:
  struct Block;
  void Free(Block* block);
  void RecordStream(Block* block, Stream& stream);
  Block* TakeCachedBlock(size_t size, Stream* stream);  // lock held
  void ProcessPendingFrees(bool wait);                  // lock held
  void ReleaseCachedBlocks();                           // lock held

  const Device device_;
  std::unique_ptr<RawMemory> raw_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
  // Cached free blocks per owning stream, ordered by size.
  std::unordered_map<Stream*, std::multimap<size_t, Block*>> free_blocks_;
  // Freed blocks still waiting for events on other streams.
  std::vector<Block*> pending_frees_;
};

}  // namespace moe
