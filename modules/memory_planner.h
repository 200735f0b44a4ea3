// The memory planner (--memory_budget_gib): decides, for each layer of each pipeline rank and each
// candidate offload group and recompute module, keep / offload / recompute, so that the rank's
// predicted peak device memory stays under the budget at the least predicted step time.
//
// What it knows (all per micro-batch, from modules/memory_estimate.h, tensor by tensor, rounded
// as the caching allocator rounds): what each layer saves under each recompute choice and which
// offload group holds it; the rank's weights, gradients and optimizer state, and its model
// chunks' RoPE tables; the head's saves; under expert parallelism, the rank's experts only.
// The schedule (engine/pipeline/schedule.h) says which (micro-batch, chunk) passes a rank holds
// when each backward starts.
//
// Peak model, per rank, in the allocator's order (the host's, which runs ahead of the device):
// the maximum over the schedule's forward phases and backward starts of
//   state + what the other passes in flight keep (their resident saves)
//   + during a pass's forward, at layer j: its saves so far, and the offloaded groups of layers j
//     and j - 1 (the host waits for a layer's copies out at the next layer's commits, or, for the
//     last layer, when backward starts: OffloadManager); at the head: its saves, its forward
//     workspace (HeadForwardWorkspace: one chunk of logits, not all of them) and the last
//     layer's offloaded groups;
//   + during its backward, for each layer j (last first): the resident saves of its layers <= j,
//     the embedding's and head's saves, the reloaded groups of layers j - prefetch_layers .. j,
//     and the layer's backward workspace (the gradients its MLP or attention allocates, plus
//     what it recomputes); before the first layer, the final norm's input gradient.
// Time model, per pass: each layer's forward takes its matmul FLOPs at matmul_flops_per_s plus
// its saved bytes at memory_bytes_per_s (element-wise work), backward twice that; the head's
// forward takes its three GEMMs (it runs its backward), its backward nothing. Offloaded
// groups copy out after their layer's forward, one at a time at copy_bytes_per_s; when the lower
// layers' copies have not ended by the end of a layer's forward, the device waits with the host
// (a forward stall). Groups copy back prefetch_layers layers ahead of their backward (not before
// their copy out ends); backward waits for a late reload. Stalls and waits are the offloads'
// exposed time. A recompute costs its module's forward time again. The predicted step cost is
// the sum over the rank's passes.
// Search, per rank: from "keep everything", repeatedly apply the one change (add an offload or
// a recompute to one layer; conflicting choices of that layer, offload_groups.h's rules, are
// dropped) with the most predicted peak bytes saved per predicted ms added, until the peak is
// under budget - margin; then undo choices that the budget does not need, costliest first.
// Routed groups' sizes do not vary in total (tokens x top-k rows, no capacity drop), only their
// split among experts; under expert parallelism they do vary per rank: the expert side of each MoE
// layer (its saves, weight-gradient operands and backward workspace) is planned at
// kExpertRowsMargin times its mean rows, the experts' state at the rank's share
// (memory_estimate.h). The margin (kPlanMargin of the budget) covers allocator rounding and
// fragmentation, and re-planning (main) covers a measured peak above the budget.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "modules/gpt_config.h"
#include "modules/memory_estimate.h"

namespace moe {

inline constexpr double kPlanMargin = 0.02;  // of the budget, kept free

struct PlannerSpeeds {
  double matmul_flops_per_s = 0;
  double memory_bytes_per_s = 0;  // element-wise kernels
  double copy_bytes_per_s = 0;    // device <-> pinned host, each direction
  // Starting values before anything is measured (CUDA: the 8-layer preset's rates; CPU: the
  // one-thread backend; memory_planner.cc).
  static PlannerSpeeds Defaults(bool cuda);
};

struct MemoryPlanRequest {
  MemoryEstimateOptions run;  // the model's recompute fields are ignored (the plan sets them)
  double budget_bytes = 0;
  std::set<std::string> offload_candidates;    // offload group names
  std::set<std::string> recompute_candidates;  // recompute module names
  int64_t min_tensor_bytes = 0;                // smaller saves are never offloaded
  int prefetch_layers = 1;
  PlannerSpeeds speeds;
  // Re-planning: per pipeline rank, bytes the measured peak exceeded the predicted one by (planned
  // around).
  std::vector<double> excess_bytes;
};

// One candidate of one layer in the plan table.
struct PlanRow {
  int rank = 0;
  int layer = 0;
  std::string name;  // offload group or recompute module
  bool is_recompute = false;
  double bytes = 0;  // per micro-batch: offloaded or dropped by recompute
  bool chosen = false;
  double exposed_ms = 0;  // per step: a late reload's wait, or the recompute
};

struct RankPlanSummary {
  double peak_bytes = 0;           // predicted
  double baseline_peak_bytes = 0;  // predicted with nothing offloaded or recomputed
  double exposed_ms = 0;           // predicted per step
  double forward_ms = 0;           // predicted per step: the forward passes' compute (time model)
  // The pinned host buffers the rank holds at most at once: one per offloaded tensor of the
  // passes in flight (forward done, backward not yet), with its offload group.
  std::vector<SavedTensorSize> host_buffers;
};

struct MemoryPlan {
  std::vector<RecomputeModules> recompute_by_layer;  // every layer of the model
  std::set<std::pair<int, std::string>> offload;     // (layer, group) pairs
  std::vector<RankPlanSummary> ranks;                // by pipeline rank
  std::vector<PlanRow> rows;
  double budget_bytes = 0;

  double peak_bytes() const;  // the largest rank's
  // The same choices (predictions aside).
  bool SameChoices(const MemoryPlan& other) const {
    return recompute_by_layer == other.recompute_by_layer && offload == other.offload;
  }
};

// Speeds that make the time model match a measured step: the compute rates of `assumed` scaled
// by predicted / measured forward time (per step, on the same plan), and the copy rate measured
// (bytes / busy time of the copies; <= 0: none moved, `assumed`'s stays).
PlannerSpeeds CalibratedSpeeds(const PlannerSpeeds& assumed, double predicted_forward_ms,
                               double measured_forward_ms, double measured_copy_bytes_per_s);

// The pinned host memory the plan's busiest rank holds (its host_buffers, as the pinned pool
// pins them: size classes, or the unpooled margin for `unpooled_groups`).
double PlanPinnedBytes(const MemoryPlan& plan, const std::set<std::string>& unpooled_groups);

// The plan, or, when even every candidate everywhere does not bring a rank under the budget, an
// error naming --memory_budget_gib, the rank and by how many GiB it misses.
StatusOr<MemoryPlan> PlanMemory(const MemoryPlanRequest& request);

// "memory plan (budget ...): rank layer candidate MiB decision exposed-ms" rows and a line per rank
// with the predicted peak (RankPlanLine).
std::string MemoryPlanTable(const MemoryPlan& plan);
// "  rank 0: predicted peak 1.25 GiB (2.50 GiB keeping everything), predicted cost 3.1 ms per
// step".
std::string RankPlanLine(const MemoryPlan& plan, int rank);

}  // namespace moe
