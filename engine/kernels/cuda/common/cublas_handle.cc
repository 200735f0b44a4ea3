#include "engine/kernels/cuda/common/cublas_handle.h"

#include <cuda_runtime.h>

#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/common/per_device.h"
#include "engine/runtime/device_context.h"

namespace moe::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS recommends for Hopper

}  // namespace

cublasHandle_t CublasHandle(Device device) {
  Stream& stream = DeviceContext::Get(device).compute_stream();  // also makes device current
  return OncePerDevice<cublasHandle_t>(device.index, [&](cublasHandle_t& handle) {
    MOE_CUBLAS_CALL(cublasCreate(&handle));
    // cublasSetStream resets the workspace, so the stream comes first.
    MOE_CUBLAS_CALL(cublasSetStream(handle, static_cast<cudaStream_t>(stream.native_handle())));
    void* workspace = nullptr;
    MOE_CUDA_CALL(cudaMalloc(&workspace, kWorkspaceBytes));
    MOE_CUBLAS_CALL(cublasSetWorkspace(handle, workspace, kWorkspaceBytes));
  });
}

}  // namespace moe::cuda
