#include <cuda_runtime.h>

#include "engine/core/cuda_check.h"
#include "engine/memory/raw_memory.h"

namespace moe {
namespace {

class CudaDeviceRawMemory final : public RawMemory {
 public:
  explicit CudaDeviceRawMemory(int device_index) : device_index_(device_index) {}
  void* Allocate(size_t bytes) override {
    MOE_CUDA_CALL(cudaSetDevice(device_index_));
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state
      return nullptr;
    }
    MOE_CUDA_CALL(status);
    return ptr;
  }
  void Free(void* ptr) override { MOE_CUDA_CALL(cudaFree(ptr)); }
  size_t CapacityBytes() const override {
    MOE_CUDA_CALL(cudaSetDevice(device_index_));
    size_t free_bytes = 0, total_bytes = 0;
    MOE_CUDA_CALL(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes;
  }

 private:
  int device_index_;
};

class CudaPinnedRawMemory final : public RawMemory {
 public:
  void* Allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    MOE_CUDA_CALL(status);
    return ptr;
  }
  void Free(void* ptr) override { MOE_CUDA_CALL(cudaFreeHost(ptr)); }
};

}  // namespace

std::unique_ptr<RawMemory> NewCudaDeviceRawMemory(int device_index) {
  return std::make_unique<CudaDeviceRawMemory>(device_index);
}
std::unique_ptr<RawMemory> NewCudaPinnedRawMemory() {
  return std::make_unique<CudaPinnedRawMemory>();
}

}  // namespace moe
