// The CPU backend's streams and events (see stream.h for the semantics).
//
// A CpuStream is either inline (the compute stream: Enqueue runs the task now, on the caller's
// thread) or a worker (a thread draining a FIFO of tasks). Waiting on an event from an inline
// stream blocks the caller; from a worker it blocks the worker, exactly like a device queue.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/core/stream.h"

namespace moe {

class CpuStream final : public Stream {
 public:
  enum class Mode { kInline, kWorker };
  explicit CpuStream(Mode mode);
  ~CpuStream() override;  // drains the queue

  Device device() const override { return Device::CPU(); }
  void CopyAsync(void* dst, const void* src, size_t bytes) override;
  void Wait(const Event& event) override;
  void Synchronize() override;
  std::unique_ptr<Event> CreateEvent(bool enable_timing) const override;
  void* native_handle() const override { return nullptr; }

  // Runs `task` in stream order.
  void Enqueue(std::function<void()> task);
  bool is_inline() const { return mode_ == Mode::kInline; }

 private:
  void WorkerLoop();

  const Mode mode_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  void Record(Stream& stream) override;
  bool Query() const override;
  void Synchronize() const override;
  float ElapsedMillisecondsSince(const Event& start) const override;

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    uint64_t recorded = 0;   // number of Record calls
    uint64_t completed = 0;  // highest record that has been reached
    std::chrono::steady_clock::time_point completed_at;
  };
  // Shared with tasks still queued on a worker, so the event may be destroyed before they run.
  std::shared_ptr<State> state_ = std::make_shared<State>();

  friend class CpuStream;
  static void WaitFor(const std::shared_ptr<State>& state, uint64_t target);
};

}  // namespace moe
