#include "apps/moe_train/memory_check.h"

#include <string>

#include "apps/common/device_capacity.h"
#include "apps/moe_train/flag_table.h"
#include "engine/core/check.h"
#include "modules/memory_estimate.h"
#include "modules/trainer.h"

namespace moe {
namespace {

// The run's model, batch and layout, as the estimate and the planner take them.
MemoryEstimateOptions EstimateOptions(const RunConfig& run) {
  MemoryEstimateOptions options;
  options.model = run.model;
  options.micro_batch_size = run.trainer.micro_batch_size;
  options.micro_batches =
      run.trainer.global_batch_size / (run.trainer.micro_batch_size * run.data_parallel);
  options.pipeline_parallel = run.pipeline_parallel;
  options.virtual_pipeline = run.trainer.virtual_pipeline;
  options.first_stage_layers = run.trainer.first_stage_layers;
  options.last_stage_layers = run.trainer.last_stage_layers;
  options.cuda = run.device.is_cuda();
  options.state_shards = run.state_shards();
  options.expert_parallel = run.expert_parallel;
  options.dtypes = run.trainer.optimizer_dtypes;
  return options;
}

}  // namespace

StatusOr<LayoutMemoryEstimate> EstimateRunMemory(const RunConfig& run) {
  MOE_RETURN_IF_ERROR(CheckBatchSplit(run.trainer, run.data_parallel));
  return EstimateLayoutMemory(EstimateOptions(run));
}

double CheckedBytes(const RunConfig& run, const RankMemoryEstimate& rank) {
  const MemoryEstimate& e = rank.memory;
  return run.trainer.offload ? e.state_bytes + e.workspace_bytes : e.total_bytes;
}

std::string MemoryEstimateLine(const LayoutMemoryEstimate& estimate, int virtual_pipeline) {
  const RankMemoryEstimate& r = estimate.busiest();
  const MemoryEstimate& e = r.memory;
  const std::string where = estimate.ranks.size() == 1
                                ? " per rank"
                                : " on pipeline rank " + std::to_string(r.rank) +
                                      ", the busiest of " + std::to_string(estimate.ranks.size());
  const std::string in_flight = std::to_string(r.passes_in_flight) +
                                (virtual_pipeline > 1 ? " chunk pass" : " micro-batch") +
                                (r.passes_in_flight == 1 ? "" : "es") + " in flight";
  return "memory: estimated " + Bytes(e.total_bytes) + where + ": weights " +
         Bytes(r.weight_bytes) + ", gradients " + Bytes(r.gradient_bytes) + ", optimizer " +
         Bytes(r.optimizer_bytes) + ", activations " + Bytes(e.activation_bytes) + " (" +
         in_flight + "), workspace " + Bytes(e.workspace_bytes);
}

Status CheckMemoryFits(const RunConfig& run, const LayoutMemoryEstimate& estimate,
                       size_t capacity_bytes, int ranks_sharing) {
  if (capacity_bytes == 0) return Status::Ok();
  if (run.memory_budget) {  // the planner decides what fits in the budget
    const double rank_capacity = UsableBytes(run.device, capacity_bytes) / ranks_sharing;
    if (run.memory_budget->bytes <= rank_capacity) return Status::Ok();
    return InvalidArgument(
        "--memory_budget_gib=" + FlagValueText("memory_budget_gib") +
        " is more than a rank can have: " + CapacityText(run.device, capacity_bytes) +
        (ranks_sharing > 1 ? ", shared by " + std::to_string(ranks_sharing) + " ranks on this host"
                           : ""));
  }
  const MemoryEstimate& e = estimate.busiest().memory;
  // Refuse only what cannot fit: the counted bytes (layout_estimate.h), without the activations
  // when offloading keeps fewer of them on the device than the estimate counts, against what the
  // device leaves a run (apps/common/device_capacity.h).
  const bool fewer_activations = run.trainer.offload.has_value();
  const double counted = CheckedBytes(run, estimate.busiest());
  if (counted * ranks_sharing <= UsableBytes(run.device, capacity_bytes)) return Status::Ok();
  std::string per_rank =
      ranks_sharing > 1 ? " for each of " + std::to_string(ranks_sharing) + " ranks on this host"
                        : "";
  const std::string activations = fewer_activations ? "activations not counted (offloaded)"
                                                    : "activations " + Bytes(e.activation_bytes);
  // Where the state alone does not fit, fewer activations cannot help: only more ranks can.
  const bool state_alone = e.state_bytes * ranks_sharing > UsableBytes(run.device, capacity_bytes);
  const std::string remedy =
      state_alone ? "spread the model over more ranks under mpirun (--pipeline_parallel, "
                    "--expert_model_parallel_size, --use_distributed_optimizer; plan it with "
                    "--dry_run --dry_run_world_size=N) "
                    "or reduce the model (--num_layers, --hidden_size, ...)"
                  : "reduce the model (--num_layers, --hidden_size, ...), --seq_length or "
                    "--micro_batch_size, or add --recompute_modules or --offload_modules";
  return InvalidArgument("the run needs at least about " + Bytes(counted) + per_rank +
                         " (weights, gradients and optimizer state " + Bytes(e.state_bytes) + ", " +
                         activations + ", workspace " + Bytes(e.workspace_bytes) + ") but " +
                         CapacityText(run.device, capacity_bytes) + ": " + remedy);
}

MemoryPlanRequest MemoryPlanRequestFor(const RunConfig& run) {
  CHECK(run.memory_budget.has_value());
  const MemoryBudget& budget = *run.memory_budget;
  MemoryPlanRequest request;
  request.run = EstimateOptions(run);
  request.budget_bytes = budget.bytes;
  request.offload_candidates = budget.offload_candidates;
  request.recompute_candidates = budget.recompute_candidates;
  if (run.trainer.offload) {
    request.min_tensor_bytes = run.trainer.offload->min_tensor_bytes;
    request.prefetch_layers = run.trainer.offload->prefetch_layers;
  }
  request.speeds = PlannerSpeeds::Defaults(request.run.cuda);
  return request;
}

Status CheckPinnedFits(const RunConfig& run, const MemoryPlan& plan, size_t host_bytes,
                       int ranks_sharing) {
  if (host_bytes == 0 || !run.trainer.offload) return Status::Ok();
  const double pinned = PlanPinnedBytes(plan, run.trainer.offload->unpooled_groups);
  const double device = run.device.is_cuda() ? 0 : run.memory_budget->bytes;
  const double share = static_cast<double>(host_bytes) / ranks_sharing;
  if (pinned + device <= share) return Status::Ok();
  std::string sharing =
      ranks_sharing > 1 ? " for each of " + std::to_string(ranks_sharing) + " ranks on this host"
                        : "";
  return InvalidArgument(
      "--memory_budget_gib=" + FlagValueText("memory_budget_gib") + ": the plan pins " +
      Bytes(pinned) + " of host memory per rank for offloaded activations" +
      (device > 0 ? " beside the budget's device memory" : "") + ", more than this host's " +
      Bytes(static_cast<double>(host_bytes)) + " of physical memory allows" + sharing +
      " (raise the budget, or recompute instead: --offload_modules= "
      "--recompute_modules=auto)");
}

void ApplyMemoryPlan(const MemoryPlan& plan, RunConfig& run) {
  run.model.recompute_by_layer = plan.recompute_by_layer;
  if (run.trainer.offload) run.trainer.offload->planned = plan.offload;
}

}  // namespace moe
