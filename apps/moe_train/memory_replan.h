// MemoryReplanner: keeps a planned run's memory plan (--memory_budget_gib,
// modules/memory_planner.h) true to what its steps measure. After each step from the second this
// process runs (the first also loads kernels and warms the libraries):
// - Calibration, once, on the first of those steps: the time model's speeds from the measured
//   forward time (StepStats::breakdown, mean over ranks) against the plan's prediction, and the
//   measured copy rate (StepStats::copy_bytes_per_s) when anything moved (CalibratedSpeeds).
// - Over budget: when a pipeline rank's measured peak (the largest of its replicas') exceeds the
//   budget, its excess over the prediction is planned around from then on.
// Either one plans again, offloads and recompute (Trainer::SetMemoryPlan applies both from the
// next step). Every rank computes the same plan: the figures are global.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "modules/memory_planner.h"
#include "modules/trainer.h"

namespace moe {

class MemoryReplanner {
 public:
  // `request`: the one the plan was made from; `data_parallel`: replicas per pipeline rank.
  MemoryReplanner(MemoryPlanRequest request, int data_parallel);

  struct Update {
    bool changed = false;  // the plan's choices changed
    std::string note;      // one line for the log, or ""
  };
  // Updates `plan` after a step. An error when re-planning cannot fit the budget.
  StatusOr<Update> AfterStep(const StepStats& stats, MemoryPlan& plan);

 private:
  MemoryPlanRequest request_;
  const int data_parallel_;
  int64_t steps_ = 0;
};

}  // namespace moe
