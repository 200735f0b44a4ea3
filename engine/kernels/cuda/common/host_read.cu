// CUDA ReadSmallToHost (contract: engine/kernels/op_declarations.inc). Each device has a mapped
// pinned buffer of kSmallReadBytes, made on first use and kept for the life of the process (like
// the cuBLAS handles). A one-block kernel on the compute stream stores src into it; the host
// waits for the compute stream and copies the bytes out. The stores cross the bus from the SMs,
// not through a copy engine, so the read never queues behind large transfers on other streams
// (the offload copies: one layer's activations take milliseconds to leave the device). A mutex
// serialises readers of one device, who share its buffer.
#include <cstring>
#include <mutex>

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/common/per_device.h"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

template <typename Word>
__global__ void StoreWords(const Word* src, Word* mapped, int64_t count) {
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) mapped[i] = src[i];
}

struct ReadBuffer {
  std::mutex mutex;
  void* host = nullptr;
  void* mapped = nullptr;  // host's address in the device's address space
};

ReadBuffer& ReadBufferOf(Device device) {
  DeviceContext::Get(device);  // makes the device current
  return OncePerDevice<ReadBuffer>(device.index, [](ReadBuffer& buffer) {
    MOE_CUDA_CALL(cudaHostAlloc(&buffer.host, kSmallReadBytes, cudaHostAllocMapped));
    MOE_CUDA_CALL(cudaHostGetDevicePointer(&buffer.mapped, buffer.host, 0));
  });
}

}  // namespace

void ReadSmallToHost(const Tensor& src, void* dst) {
  const size_t bytes = src.nbytes();
  CHECK_LE(bytes, kSmallReadBytes) << "ReadSmallToHost: " << src.DebugString();
  if (bytes == 0) return;
  ReadBuffer& buffer = ReadBufferOf(src.device());
  std::lock_guard<std::mutex> lock(buffer.mutex);
  const cudaStream_t stream = StreamOf(src);
  if (bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src.data()) % 4 == 0) {
    StoreWords<<<1, 256, 0, stream>>>(static_cast<const uint32_t*>(src.data()),
                                      static_cast<uint32_t*>(buffer.mapped), bytes / 4);
  } else {
    StoreWords<<<1, 256, 0, stream>>>(static_cast<const uint8_t*>(src.data()),
                                      static_cast<uint8_t*>(buffer.mapped), bytes);
  }
  MOE_CUDA_CHECK_LAUNCH();
  MOE_CUDA_CALL(cudaStreamSynchronize(stream));
  std::memcpy(dst, buffer.host, bytes);
}

}  // namespace moe::cuda
