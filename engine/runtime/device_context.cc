#include "engine/runtime/device_context.h"

#include <map>
#include <mutex>

#include "engine/runtime/cpu_stream.h"
#if MOE_WITH_CUDA
#include <cuda_runtime.h>

#include "engine/core/cuda_check.h"
#include "engine/runtime/cuda_stream.h"
#endif

namespace moe {

DeviceContext& DeviceContext::Get(Device device) {
  static std::mutex mutex;
  // Contexts are never destroyed: tensors may outlive main()'s locals, and their storage returns
  // to these allocators.
  static auto* contexts = new std::map<std::pair<int, int>, DeviceContext*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(static_cast<int>(device.type), device.index);
  auto it = contexts->find(key);
  if (it == contexts->end()) it = contexts->emplace(key, new DeviceContext(device)).first;
#if MOE_WITH_CUDA
  if (device.is_cuda()) MOE_CUDA_CALL(cudaSetDevice(device.index));
#endif
  return *it->second;
}

DeviceContext::DeviceContext(Device device) : device_(device) {
  if (!device.is_cuda()) {
    CHECK_EQ(device.index, 0) << "the CPU backend has one device";
    compute_stream_ = std::make_unique<CpuStream>(CpuStream::Mode::kInline);
    allocator_ = std::make_unique<CachingAllocator>(device, NewHostRawMemory());
    pinned_pool_ = std::make_unique<PinnedHostPool>(device, NewHostRawMemory());
    return;
  }
#if MOE_WITH_CUDA
  const Status available = CheckDeviceAvailable(device);
  CHECK(available.ok()) << available.message();
  MOE_CUDA_CALL(cudaSetDevice(device.index));
  compute_stream_ = std::make_unique<CudaStream>(device.index);
  allocator_ = std::make_unique<CachingAllocator>(device, NewCudaDeviceRawMemory(device.index));
  pinned_pool_ = std::make_unique<PinnedHostPool>(device, NewCudaPinnedRawMemory());
#else
  LOG(FATAL) << "this build has no CUDA support; use the cpu device";
#endif
}

std::unique_ptr<Stream> DeviceContext::CreateSideStream() {
#if MOE_WITH_CUDA
  if (device_.is_cuda()) return std::make_unique<CudaStream>(device_.index);
#endif
  return std::make_unique<CpuStream>(CpuStream::Mode::kWorker);
}

int CudaDeviceCount() {
#if MOE_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

Status CheckDeviceAvailable(Device device) {
  if (!device.is_cuda()) return Status::Ok();
  if (!MOE_WITH_CUDA)
    return FailedPrecondition("this build has no CUDA support (nvcc was not found)");
  const int count = CudaDeviceCount();
  if (device.index < 0 || device.index >= count) {
    return FailedPrecondition(device.ToString() + " is not available: this machine has " +
                              std::to_string(count) + " CUDA device(s)");
  }
  return Status::Ok();
}

}  // namespace moe
