// When a moe_train run stops before --train_steps, on every rank at the same step. main asks
// RunStop::Check before every step (so also once before the first): a collective over every rank,
// one small host all-reduce of what each rank has seen, so that the ranks agree on the step even
// when a signal reached only some of them. The reasons, the first that applies:
// - a stop signal (engine/runtime/stop_signal.h: SIGTERM, SIGINT, SIGUSR1) that any rank has
//   received;
// - --exit_interval=N: the step just trained is a multiple of N (Megatron-LM's --exit-interval;
//   a resumed run stops at the next multiple, never at the step it resumed from);
// - --exit_duration_in_mins=M: the next step would end more than M minutes after the process
//   started (the time since then plus the longest step so far, its evaluation and save
//   included), so that the run stops, and saves, before the limit rather than a step after it.
//   The first rank whose clock says so stops them all.
// main then saves that step when --save is set and it is not saved yet, prints one line saying
// why the run stopped, and exits with kExitStoppedEarly. A signal during the last step lets the
// run finish (exit 0).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "engine/distributed/communicator.h"

namespace moe {

// EX_TEMPFAIL of sysexits.h, "try again later": stopped before --train_steps; continue with
// --load.
inline constexpr int kExitStoppedEarly = 75;

class RunStop {
 public:
  // `world`: every rank; `started`: when the process started; `first_step`: the step the run
  // starts from (0, or the step it resumed).
  RunStop(Communicator* world, std::chrono::steady_clock::time_point started, int64_t first_step);

  // Collective. "" to go on; else why the run stops at `step`, the step last trained:
  // "SIGTERM (received by 1 of 2 ranks)", "--exit_interval=5".
  std::string Check(int64_t step);

 private:
  Communicator* const world_;
  const std::chrono::steady_clock::time_point started_;
  const int64_t first_step_;
  std::chrono::steady_clock::time_point last_check_;
  std::chrono::steady_clock::duration longest_step_{0};
};

}  // namespace moe
