#include "engine/runtime/cuda_stream.h"

#include "engine/core/cuda_check.h"

namespace moe {

CudaStream::CudaStream(int device_index) : device_index_(device_index) {
  MOE_CUDA_CALL(cudaSetDevice(device_index_));
  MOE_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

void CudaStream::CopyAsync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  MOE_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaStream::Wait(const Event& event) {
  MOE_CUDA_CALL(cudaStreamWaitEvent(stream_, dynamic_cast<const CudaEvent&>(event).get(), 0));
}

void CudaStream::Synchronize() { MOE_CUDA_CALL(cudaStreamSynchronize(stream_)); }

std::unique_ptr<Event> CudaStream::CreateEvent(bool enable_timing) const {
  return std::make_unique<CudaEvent>(device_index_, enable_timing);
}

CudaEvent::CudaEvent(int device_index, bool enable_timing) : device_index_(device_index) {
  MOE_CUDA_CALL(cudaSetDevice(device_index_));
  MOE_CUDA_CALL(
      cudaEventCreateWithFlags(&event_, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() { cudaEventDestroy(event_); }

void CudaEvent::Record(Stream& stream) {
  MOE_CUDA_CALL(cudaEventRecord(event_, dynamic_cast<CudaStream&>(stream).get()));
}

bool CudaEvent::Query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  MOE_CUDA_CALL(status);
  return true;
}

void CudaEvent::Synchronize() const { MOE_CUDA_CALL(cudaEventSynchronize(event_)); }

float CudaEvent::ElapsedMillisecondsSince(const Event& start) const {
  float ms = 0;
  MOE_CUDA_CALL(cudaEventSynchronize(event_));
  MOE_CUDA_CALL(cudaEventElapsedTime(&ms, dynamic_cast<const CudaEvent&>(start).get(), event_));
  return ms;
}

}  // namespace moe
