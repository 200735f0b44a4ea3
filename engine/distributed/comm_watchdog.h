// CommWatchdog: turns a hung or failed communicator into a prompt, loud process exit instead of a
// silent hang (after PyTorch's NCCL watchdog).
//
// A thread wakes every poll interval (a tenth of the timeout, clamped to [10 ms, 1 s]) and checks
// the backend's asynchronous error (NCCL: ncclCommGetAsyncError), then the oldest tracked
// operation that has not finished. On an error, or when that operation was tracked more than
// `timeout` ago, it logs the failure, calls the backend's abort (NCCL: ncclCommAbort, which
// returns stuck kernels; given at most 10 s, as it can block too) and ends the process with
// LOG(FATAL) naming the operation, the communicator, rank and host.
// Under mpirun that exit makes mpirun end every other rank.
//
// Operations of one communicator finish in the order they were tracked (they share one stream),
// so only the oldest unfinished one is looked at.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace moe {

class CommWatchdog {
 public:
  struct Hooks {
    std::function<void()> thread_setup;        // first thing on the watchdog thread
    std::function<std::string()> async_error;  // "" while healthy
    std::function<void()> abort;               // just before the process ends
  };

  CommWatchdog(std::string name, std::chrono::milliseconds timeout, Hooks hooks = {});
  ~CommWatchdog();  // stops watching; operations still tracked are forgotten

  // Watches one operation until `done()` returns true. `done` runs on the watchdog thread.
  void Track(std::string description, std::function<bool()> done);

 private:
  struct Operation {
    std::string description;
    std::function<bool()> done;
    std::chrono::steady_clock::time_point since;
  };

  void Loop();
  [[noreturn]] void Fail(const std::string& what);

  const std::string name_;
  const std::chrono::milliseconds timeout_;
  const Hooks hooks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Operation> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace moe
