// Where allocators get memory from and give it back: cudaMalloc, cudaHostAlloc, or aligned host
// memory for the CPU backend's device arena and pinned pool. Allocate returns nullptr when out.
// CapacityBytes is what the source can hold at most, for estimates made before a run: the
// device's total memory (cudaMemGetInfo) on CUDA, physical memory for host sources; 0 unknown.
#pragma once

#include <cstddef>
#include <memory>

namespace moe {

class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual size_t CapacityBytes() const { return 0; }
};

// 256-byte aligned host memory (the CPU backend's "device" and "pinned" memory).
std::unique_ptr<RawMemory> NewHostRawMemory();
#if MOE_WITH_CUDA
std::unique_ptr<RawMemory> NewCudaDeviceRawMemory(int device_index);
std::unique_ptr<RawMemory> NewCudaPinnedRawMemory();
#endif

}  // namespace moe
