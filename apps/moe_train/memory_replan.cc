#include "apps/moe_train/memory_replan.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/byte_units.h"

namespace moe {

MemoryReplanner::MemoryReplanner(MemoryPlanRequest request, int data_parallel)
    : request_(std::move(request)), data_parallel_(data_parallel) {
  request_.excess_bytes.assign(request_.run.pipeline_parallel, 0.0);
}

StatusOr<MemoryReplanner::Update> MemoryReplanner::AfterStep(const StepStats& stats,
                                                             MemoryPlan& plan) {
  if (++steps_ < 2) return Update{};
  Update update;
  bool replan = false;
  if (steps_ == 2) {
    double predicted_forward_ms = 0;
    for (const RankPlanSummary& r : plan.ranks) predicted_forward_ms += r.forward_ms;
    predicted_forward_ms /= static_cast<double>(plan.ranks.size());
    const double measured_forward_ms = stats.breakdown[StepPhase::kForward];
    const PlannerSpeeds assumed = request_.speeds;
    request_.speeds = CalibratedSpeeds(assumed, predicted_forward_ms, measured_forward_ms,
                                       stats.copy_bytes_per_s);
    char line[256];
    snprintf(line, sizeof(line),
             "memory plan calibrated on this step: forward %.1f ms measured, %.1f predicted "
             "(compute rates x%.2f); copies %.1f GB/s %s",
             measured_forward_ms, predicted_forward_ms,
             request_.speeds.matmul_flops_per_s / assumed.matmul_flops_per_s,
             request_.speeds.copy_bytes_per_s / 1e9,
             stats.copy_bytes_per_s > 0 ? "measured" : "assumed (nothing moved)");
    update.note = line;
    replan = true;
  }
  for (int rank = 0; rank < request_.run.pipeline_parallel; ++rank) {
    double measured = 0;
    for (int d = 0; d < data_parallel_; ++d) {
      measured = std::max(measured, stats.peak_device_mib[rank * data_parallel_ + d] * kMiB);
    }
    if (measured <= request_.budget_bytes) continue;
    replan = true;
    double& excess = request_.excess_bytes[rank];
    excess = std::max(excess, measured - plan.ranks[rank].peak_bytes);
    char line[160];
    snprintf(line, sizeof(line),
             "%spipeline rank %d's step peak %.0f MiB is over the budget: "
             "planning around %.0f MiB more than predicted",
             update.note.empty() ? "" : "; ", rank, measured / kMiB, excess / kMiB);
    update.note += line;
  }
  if (!replan) return update;
  StatusOr<MemoryPlan> replanned = PlanMemory(request_);
  if (!replanned.ok()) {
    return InvalidArgument("the measured step does not fit the plan and re-planning failed: " +
                           replanned.status().message());
  }
  update.changed = !replanned->SameChoices(plan);
  plan = std::move(replanned).value();
  if (!update.note.empty()) update.note += update.changed ? "; re-planned" : "; the plan stands";
  return update;
}

}  // namespace moe
