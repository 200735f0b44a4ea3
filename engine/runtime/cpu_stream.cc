#include "engine/runtime/cpu_stream.h"

#include <atomic>
#include <cstring>

#include <glog/logging.h>

namespace moe {
namespace {
std::atomic<int64_t> g_copy_latency_us{0};
}  // namespace

void SetCpuCopyLatencyForTesting(std::chrono::microseconds latency) {
  g_copy_latency_us = latency.count();
}
std::chrono::microseconds CpuCopyLatency() { return std::chrono::microseconds(g_copy_latency_us); }

CpuStream::CpuStream(Mode mode) : mode_(mode) {
  if (mode_ == Mode::kWorker) worker_ = std::thread([this] { WorkerLoop(); });
}

CpuStream::~CpuStream() {
  if (mode_ != Mode::kWorker) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CpuStream::Enqueue(std::function<void()> task) {
  if (mode_ == Mode::kInline) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    ++enqueued_;
  }
  cv_.notify_all();
}

void CpuStream::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping and drained
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // release what the task holds (it may free memory that enqueues) unlocked
    lock.lock();
    ++finished_;
    cv_.notify_all();
  }
}

void CpuStream::CopyAsync(void* dst, const void* src, size_t bytes) {
  const bool delayed = mode_ == Mode::kWorker;
  Enqueue([dst, src, bytes, delayed] {
    if (delayed) {
      const auto latency = CpuCopyLatency();
      if (latency.count() > 0) std::this_thread::sleep_for(latency);
    }
    if (bytes > 0) std::memcpy(dst, src, bytes);  // an empty tensor may have no storage
  });
}

void CpuStream::Wait(const Event& event) {
  const auto& cpu_event = dynamic_cast<const CpuEvent&>(event);
  std::shared_ptr<CpuEvent::State> state = cpu_event.state_;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    target = state->recorded;
  }
  Enqueue([state, target] { CpuEvent::WaitFor(state, target); });
}

void CpuStream::Synchronize() {
  if (mode_ == Mode::kInline) return;
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = enqueued_;
  cv_.wait(lock, [this, target] { return finished_ >= target; });
}

std::unique_ptr<Event> CpuStream::CreateEvent(bool /*enable_timing*/) const {
  return std::make_unique<CpuEvent>();
}

void CpuEvent::Record(Stream& stream) {
  auto& cpu_stream = dynamic_cast<CpuStream&>(stream);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    id = ++state_->recorded;
  }
  cpu_stream.Enqueue([state = state_, id] {
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (id > state->completed) {
        state->completed = id;
        state->completed_at = std::chrono::steady_clock::now();
      }
    }
    state->cv.notify_all();
  });
}

bool CpuEvent::Query() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->completed >= state_->recorded;
}

void CpuEvent::WaitFor(const std::shared_ptr<State>& state, uint64_t target) {
  std::unique_lock<std::mutex> lock(state->mutex);
  state->cv.wait(lock, [&] { return state->completed >= target; });
}

void CpuEvent::Synchronize() const {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    target = state_->recorded;
  }
  WaitFor(state_, target);
}

float CpuEvent::ElapsedMillisecondsSince(const Event& start) const {
  const auto& other = dynamic_cast<const CpuEvent&>(start);
  Synchronize();
  other.Synchronize();
  std::chrono::steady_clock::time_point begin, end;
  {
    std::lock_guard<std::mutex> lock(other.state_->mutex);
    begin = other.state_->completed_at;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    end = state_->completed_at;
  }
  return std::chrono::duration<float, std::milli>(end - begin).count();
}

}  // namespace moe
