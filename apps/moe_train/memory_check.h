// Whether a run fits the device, checked before any work: the estimate of
// modules/memory_estimate.h for this rank against the device's capacity (CUDA: the GPU's total
// memory; CPU: physical memory, shared by the ranks on this host). A run that does not fit is
// one line naming the estimate, its parts and the capacity. With --memory_budget_gib the memory
// planner (modules/memory_planner.h) decides instead, and the budget must fit the device.
#pragma once

#include <cstddef>
#include <vector>

#include "apps/moe_train/run_flags.h"
#include "engine/core/status.h"
#include "modules/memory_planner.h"

namespace moe {

// `capacity_bytes`: 0 (unknown) passes. `ranks_sharing`: ranks whose memory comes from the same
// capacity (CPU: this host's ranks; CUDA: 1). With --memory_budget_gib: the budget must fit a
// rank's share (PlanRunMemory then decides what fits in the budget).
Status CheckMemoryFits(const RunConfig& run, size_t capacity_bytes, int ranks_sharing);

// The memory plan for run.memory_budget (set), or, when a rank cannot fit, the one-line error.
// Re-planning a running trainer: `excess_bytes` (by pipeline rank) and `fixed_recompute` (the
// model's current recompute_by_layer, kept), see MemoryPlanRequest.
StatusOr<MemoryPlan> PlanRunMemory(const RunConfig& run,
                                   const std::vector<double>& excess_bytes = {},
                                   const std::vector<RecomputeModules>& fixed_recompute = {});
// Sets the plan's choices into `run`: each layer's recompute and the offloaded (layer, group)s.
void ApplyMemoryPlan(const MemoryPlan& plan, RunConfig& run);

}  // namespace moe
