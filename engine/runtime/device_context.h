// DeviceContext: the per-device runtime every op and allocation goes through. One per device,
// created on first use and kept for the life of the process: its compute stream, its caching
// allocator and its pinned host pool. On CUDA, creating it selects the device for the thread.
#pragma once

#include <memory>

#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/core/stream.h"
#include "engine/memory/caching_allocator.h"
#include "engine/memory/pinned_host_pool.h"

namespace moe {

class StepTimeline;

class DeviceContext {
 public:
  static DeviceContext& Get(Device device);

  Device device() const { return device_; }
  // Where ops run. CPU: inline on the calling thread.
  Stream& compute_stream() { return *compute_stream_; }
  // A new stream beside the compute stream (copies, communication). CPU: a worker thread.
  std::unique_ptr<Stream> CreateSideStream();
  CachingAllocator& allocator() { return *allocator_; }
  PinnedHostPool& pinned_pool() { return *pinned_pool_; }
  // The training step's timeline (step_timeline.h) while a step runs on this device, else
  // nullptr. The trainer sets it for the duration of its step.
  StepTimeline* timeline() const { return timeline_; }
  void set_timeline(StepTimeline* timeline) { timeline_ = timeline; }

 private:
  explicit DeviceContext(Device device);

  Device device_;
  std::unique_ptr<Stream> compute_stream_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<PinnedHostPool> pinned_pool_;
  StepTimeline* timeline_ = nullptr;
};

// Number of CUDA devices usable by this build on this machine (0 when built without CUDA).
int CudaDeviceCount();
// OK if `device` can be used here; otherwise a message naming what is missing.
Status CheckDeviceAvailable(Device device);

}  // namespace moe
