// CommWatchdog: turns a hung or failed communicator into a prompt, loud process exit instead of a
// silent hang (after PyTorch's NCCL watchdog).
//
// A thread wakes every poll interval (a tenth of the timeout, clamped to [10 ms, 1 s]) and checks
// the backend's asynchronous error (NCCL: ncclCommGetAsyncError), then the oldest tracked
// operation that has not finished. On an error, or when that operation was tracked more than
// `timeout` ago, it fails:
// - after a timeout, the census hook (if any: mpi_peer_census.h) names the ranks of the
//   communicator that did not arrive at the operation ("rank 1 did not arrive") and says which
//   rank reports it: one line for the job, from the lowest rank that waits;
// - it calls the backend's abort (NCCL: ncclCommAbort, which returns stuck kernels; given at
//   most 10 s, as it can block too);
// - the reporting rank passes the message (naming the operation, the communicator, what the
//   census found, rank and host) to the process's CommFailureHandler, which an app installs to
//   print one line and exit non-zero; without one, the message is LOG(FATAL), as for any broken
//   invariant. A rank that does not report waits (twice the census grace plus 10 s) for the
//   reporting rank's exit to end the job (under mpirun one rank's non-zero exit ends every
//   rank), and reports itself only if it is still running then.
// Only the first failure of a process is reported; the watchdog of another communicator that
// fails meanwhile waits for the process to end.
//
// A poll that comes more than half a timeout after the one before means this process was frozen
// (SIGSTOP, a suspended machine; mpirun resumes a stopped rank before ending it): the time frozen
// does not count against the operations' peers, whose clocks restart then.
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

// Called with the failure's message; must not return (it ends the process). nullptr removes
// the handler. Returns the previous one.
using CommFailureHandler = void (*)(const std::string& message);
CommFailureHandler SetCommFailureHandler(CommFailureHandler handler);

class CommWatchdog {
 public:
  // Who did not arrive at a timed-out operation, and whether this rank reports the failure.
  struct Census {
    std::string finding;  // "rank 1 did not arrive", "every rank waits (...)"
    bool report_here = true;
  };

  struct Hooks {
    std::function<void()> thread_setup;        // first thing on the watchdog thread
    std::function<std::string()> async_error;  // "" while healthy
    std::function<void()> abort;               // just before the process ends
    // After a timeout: asks the peers for `grace` about the operation described
    // (mpi_peer_census.h).
    std::function<Census(const std::string& operation, std::chrono::milliseconds grace)> census;
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
  // `timed_out`: the operation described in `what`, for the census.
  [[noreturn]] void Fail(const std::string& what, const std::string* timed_out);

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
