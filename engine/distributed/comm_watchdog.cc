#include "engine/distributed/comm_watchdog.h"

#include <algorithm>
#include <future>
#include <memory>

#include "engine/core/check.h"

namespace moe {
namespace {
constexpr std::chrono::seconds kAbortGrace(10);
}  // namespace

CommWatchdog::CommWatchdog(std::string name, std::chrono::milliseconds timeout, Hooks hooks)
    : name_(std::move(name)), timeout_(timeout), hooks_(std::move(hooks)) {
  CHECK_GT(timeout_.count(), 0);
  thread_ = std::thread([this] { Loop(); });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommWatchdog::Track(std::string description, std::function<bool()> done) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({std::move(description), std::move(done), std::chrono::steady_clock::now()});
}

void CommWatchdog::Loop() {
  if (hooks_.thread_setup) hooks_.thread_setup();
  const auto poll = std::clamp<std::chrono::milliseconds>(
      timeout_ / 10, std::chrono::milliseconds(10), std::chrono::seconds(1));
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait_for(lock, poll, [this] { return stopping_; });
    if (stopping_) return;
    if (hooks_.async_error) {
      const std::string error = hooks_.async_error();
      if (!error.empty()) Fail("asynchronous error: " + error);
    }
    while (!pending_.empty() && pending_.front().done()) pending_.pop_front();
    if (pending_.empty()) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - pending_.front().since);
    if (waited > timeout_) {
      Fail("timed out: " + pending_.front().description + " has not finished after " +
           std::to_string(waited.count()) + " ms (timeout " + std::to_string(timeout_.count()) +
           " ms); a peer may have died or issued different operations");
    }
  }
}

void CommWatchdog::Fail(const std::string& what) {
  const std::string message = "communicator " + name_ + " " + what + " (rank " +
                              std::to_string(ProcessRank()) + ", host " + HostName() + ")";
  if (hooks_.abort) {
    LOG(ERROR) << message << "; aborting the communicator";
    // The abort may itself block on a wedged peer or device: give it a bounded time.
    auto aborted = std::make_shared<std::promise<void>>();
    std::future<void> finished = aborted->get_future();
    std::thread([abort = hooks_.abort, aborted] {
      abort();
      aborted->set_value();
    }).detach();
    if (finished.wait_for(kAbortGrace) != std::future_status::ready) {
      LOG(ERROR) << "the communicator abort did not return within " << kAbortGrace.count()
                 << " s; ending the process anyway";
    }
  }
  LOG(FATAL) << message;
  __builtin_unreachable();
}

}  // namespace moe
