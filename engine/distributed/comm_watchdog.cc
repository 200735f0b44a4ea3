#include "engine/distributed/comm_watchdog.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <memory>

#include "engine/core/check.h"

namespace moe {
namespace {

constexpr std::chrono::seconds kAbortGrace(10);

std::atomic<CommFailureHandler> failure_handler{nullptr};
std::atomic<bool> failing{false};  // a watchdog of this process is reporting a failure

}  // namespace

CommFailureHandler SetCommFailureHandler(CommFailureHandler handler) {
  return failure_handler.exchange(handler);
}

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
  auto last_poll = std::chrono::steady_clock::now();
  while (true) {
    cv_.wait_for(lock, poll, [this] { return stopping_; });
    if (stopping_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_poll > timeout_ / 2) {  // this process was frozen: its peers were not late
      for (Operation& operation : pending_) operation.since = now;
    }
    last_poll = now;
    if (hooks_.async_error) {
      const std::string error = hooks_.async_error();
      if (!error.empty()) Fail("asynchronous error: " + error, nullptr);
    }
    while (!pending_.empty() && pending_.front().done()) pending_.pop_front();
    if (pending_.empty()) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - pending_.front().since);
    if (waited > timeout_) {
      const std::string operation = pending_.front().description;
      Fail("timed out: " + operation + " has not finished after " + std::to_string(waited.count()) +
               " ms (timeout " + std::to_string(timeout_.count()) + " ms)",
           &operation);
    }
  }
}

void CommWatchdog::Fail(const std::string& what, const std::string* timed_out) {
  if (failing.exchange(true)) {  // another watchdog of this process reports
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  Census census{timed_out ? "a peer may have died or issued different operations" : "", true};
  const auto grace = std::clamp<std::chrono::milliseconds>(
      timeout_ / 4, std::chrono::milliseconds(500), std::chrono::seconds(10));
  if (timed_out && hooks_.census) census = hooks_.census(*timed_out, grace);
  const std::string message = "communicator " + name_ + " " + what +
                              (census.finding.empty() ? "" : "; " + census.finding) + " (rank " +
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
  if (!census.report_here) std::this_thread::sleep_for(2 * grace + std::chrono::seconds(10));
  if (const CommFailureHandler handler = failure_handler.load()) handler(message);
  LOG(FATAL) << message;
  __builtin_unreachable();
}

}  // namespace moe
