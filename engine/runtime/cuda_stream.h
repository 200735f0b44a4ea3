// The CUDA backend's streams and events (see stream.h for the semantics). Streams are created
// non-blocking, so they never synchronise implicitly with the legacy default stream.
#pragma once

#include <cuda_runtime.h>

#include "engine/core/stream.h"

namespace moe {

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int device_index);
  ~CudaStream() override;

  Device device() const override { return Device::CUDA(device_index_); }
  void CopyAsync(void* dst, const void* src, size_t bytes) override;
  void Wait(const Event& event) override;
  void Synchronize() override;
  std::unique_ptr<Event> CreateEvent(bool enable_timing) const override;
  void* native_handle() const override { return stream_; }
  cudaStream_t get() const { return stream_; }

 private:
  int device_index_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int device_index, bool enable_timing);
  ~CudaEvent() override;

  void Record(Stream& stream) override;
  bool Query() const override;
  void Synchronize() const override;
  float ElapsedMillisecondsSince(const Event& start) const override;
  cudaEvent_t get() const { return event_; }

 private:
  int device_index_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace moe
