// Whether a run fits the device, checked before any work: the estimate of
// modules/layout_estimate.h for the busiest pipeline rank against the device's capacity (CUDA: the
// GPU's total memory; CPU: physical memory, shared by the ranks on this host). A run that does not
// fit is one line naming the estimate, its parts and the capacity. With --memory_budget_gib the
// memory planner (modules/memory_planner.h) decides instead, and the budget must fit the device.
// moe_train prints the estimate at start (MemoryEstimateLine); `--dry_run` (dry_run.h) prints it
// for every rank and makes the same checks against a device size it is given.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "apps/moe_train/run_flags.h"
#include "engine/core/status.h"
#include "modules/layout_estimate.h"
#include "modules/memory_planner.h"

namespace moe {

// Every pipeline rank's estimate for the run's model, batch and layout; an error (naming the
// flags) when the layers or the batch do not split over the layout, as Trainer::Create's.
StatusOr<LayoutMemoryEstimate> EstimateRunMemory(const RunConfig& run);
// What the check counts of a rank's estimate: all of it, or, when offloading keeps fewer
// activations on the device than the estimate counts (--offload_modules), all but the activations.
double CheckedBytes(const RunConfig& run, const RankMemoryEstimate& rank);
// "memory: estimated 25.3 MiB per rank: weights 1.8 MiB, gradients ..., optimizer ..., activations
// ... (1 micro-batch in flight), workspace ..."; with a pipeline, of its busiest rank ("on pipeline
// rank 0, the busiest of 2").
std::string MemoryEstimateLine(const LayoutMemoryEstimate& estimate, int virtual_pipeline);

// `capacity_bytes`: 0 (unknown) passes. `ranks_sharing`: ranks whose memory comes from the same
// capacity (CPU: this host's ranks; CUDA: 1). With --memory_budget_gib: the budget must fit a
// rank's share (the planner then decides what fits in the budget).
Status CheckMemoryFits(const RunConfig& run, const LayoutMemoryEstimate& estimate,
                       size_t capacity_bytes, int ranks_sharing);

// The planner's request for run.memory_budget (set): the run's shape and layout, the candidates,
// the time model's default speeds. Planning it gives the plan or, when a rank cannot fit, the
// one-line error; re-planning (memory_replan.h) edits its speeds and excess.
MemoryPlanRequest MemoryPlanRequestFor(const RunConfig& run);
// The plan's pinned host memory (PlanPinnedBytes) against this host's physical memory `host_bytes`
// (0: unknown, passes), shared by `ranks_sharing` ranks; on the CPU backend the device memory (the
// budget) comes from it too. A plan that pins more is the one-line error, before any work.
Status CheckPinnedFits(const RunConfig& run, const MemoryPlan& plan, size_t host_bytes,
                       int ranks_sharing);
// Sets the plan's choices into `run`: each layer's recompute and the offloaded (layer, group)s.
void ApplyMemoryPlan(const MemoryPlan& plan, RunConfig& run);

}  // namespace moe
