#include "engine/kernels/cuda/cublas_handle.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "engine/core/cuda_check.h"
#include "engine/runtime/device_context.h"

namespace moe::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS recommends for Hopper

}  // namespace

cublasHandle_t CublasHandle(Device device) {
  static std::mutex mutex;
  static auto* handles = new std::map<int, cublasHandle_t>();    // never destroyed, like contexts
  Stream& stream = DeviceContext::Get(device).compute_stream();  // also makes device current
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles->find(device.index);
  if (it != handles->end()) return it->second;
  cublasHandle_t handle = nullptr;
  MOE_CUBLAS_CALL(cublasCreate(&handle));
  // cublasSetStream resets the workspace, so the stream comes first.
  MOE_CUBLAS_CALL(cublasSetStream(handle, static_cast<cudaStream_t>(stream.native_handle())));
  void* workspace = nullptr;
  MOE_CUDA_CALL(cudaMalloc(&workspace, kWorkspaceBytes));
  MOE_CUBLAS_CALL(cublasSetWorkspace(handle, workspace, kWorkspaceBytes));
  handles->emplace(device.index, handle);
  return handle;
}

}  // namespace moe::cuda
