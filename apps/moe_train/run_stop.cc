#include "apps/moe_train/run_stop.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <vector>

#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/run_flags.h"
#include "engine/distributed/host_collectives.h"
#include "engine/runtime/stop_signal.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

double Minutes(Clock::duration d) { return std::chrono::duration<double>(d).count() / 60; }

std::string Fixed(double value, const char* format) {
  char text[32];
  snprintf(text, sizeof(text), format, value);
  return text;
}

}  // namespace

RunStop::RunStop(Communicator* world, Clock::time_point started, int64_t first_step)
    : world_(world), started_(started), first_step_(first_step), last_check_(Clock::now()) {}

std::string RunStop::Check(int64_t step) {
  const Clock::time_point now = Clock::now();
  if (step > first_step_) longest_step_ = std::max(longest_step_, now - last_check_);
  last_check_ = now;
  // Per rank: one vote for the stop signal it received (by kStopSignals), one for the duration.
  constexpr size_t kSignals = std::size(kStopSignals);
  std::vector<float> votes(kSignals + 1, 0.0f);
  for (size_t i = 0; i < kSignals; ++i) votes[i] = StopSignalReceived() == kStopSignals[i];
  const double minutes = Minutes(now - started_);
  const double longest = Minutes(longest_step_);
  votes[kSignals] =
      FLAGS_exit_duration_in_mins > 0 && minutes + longest > FLAGS_exit_duration_in_mins;
  AllReduceHostValues(world_, votes);

  std::string signals;
  int signalled = 0;
  for (size_t i = 0; i < kSignals; ++i) {
    if (votes[i] == 0) continue;
    signals += std::string(signals.empty() ? "" : ", ") + StopSignalName(kStopSignals[i]);
    signalled += static_cast<int>(votes[i]);
  }
  const int ranks = world_ == nullptr ? 1 : world_->size();
  if (!signals.empty()) {
    if (ranks == 1) return signals;
    return signals + " (received by " + std::to_string(signalled) + " of " + std::to_string(ranks) +
           " ranks)";
  }
  if (FLAGS_exit_interval > 0 && step > first_step_ && step % FLAGS_exit_interval == 0) {
    return "--exit_interval=" + FlagValueText("exit_interval");
  }
  if (votes[kSignals] > 0) {
    return "--exit_duration_in_mins=" + FlagValueText("exit_duration_in_mins") +
           ": the next step would end after it (" + Fixed(minutes, "%.2f") +
           " minutes since the start; the longest step took " + Fixed(longest * 60, "%.1f") + " s)";
  }
  return "";
}

}  // namespace moe
