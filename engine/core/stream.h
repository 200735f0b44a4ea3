// Streams and events, one interface for both backends.
//
// A Stream is an ordered queue of device work; an Event marks a point in one. Semantics follow
// CUDA: work enqueued after Stream::Wait(event) starts only once the work before the event's
// last Record has finished; Query/Synchronize observe that same point.
//
// CPU backend: the compute stream runs inline (an op has finished when its call returns); side
// streams (copies, communication) are worker threads, so an offload copy really runs beside
// compute and a missing Wait is a real race. SetCpuCopyLatencyForTesting delays every copy on a
// worker stream so that such races show up in tests.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "engine/core/device.h"

namespace moe {

class Event;

class Stream {
 public:
  virtual ~Stream() = default;

  virtual Device device() const = 0;
  // Enqueues a byte copy; pointers may be device or host memory of this stream's backend.
  virtual void CopyAsync(void* dst, const void* src, size_t bytes) = 0;
  // Later work on this stream waits for `event`.
  virtual void Wait(const Event& event) = 0;
  // Blocks the host until all work enqueued so far has finished.
  virtual void Synchronize() = 0;
  // An event of this stream's backend (unrecorded: Query() is true).
  virtual std::unique_ptr<Event> CreateEvent(bool enable_timing = false) const = 0;
  // The backend handle (cudaStream_t on CUDA, nullptr on CPU).
  virtual void* native_handle() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;

  virtual void Record(Stream& stream) = 0;
  // True once the work before the last Record has finished (or if never recorded).
  virtual bool Query() const = 0;
  virtual void Synchronize() const = 0;
  // Milliseconds between `start` and this event, both recorded with timing enabled; waits for
  // this event to complete.
  virtual float ElapsedMillisecondsSince(const Event& start) const = 0;
};

// Test-only: every copy on a CPU worker stream first sleeps this long (0 by default).
void SetCpuCopyLatencyForTesting(std::chrono::microseconds latency);
std::chrono::microseconds CpuCopyLatency();

}  // namespace moe
