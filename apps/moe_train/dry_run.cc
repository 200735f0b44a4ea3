#include "apps/moe_train/dry_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/device_capacity.h"
#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/memory_check.h"
#include "apps/moe_train/offload_flags.h"
#include "apps/moe_train/run_flags.h"
#include "apps/moe_train/run_summary.h"
#include "engine/core/byte_units.h"
#include "modules/layout_estimate.h"
#include "modules/memory_planner.h"
#include "modules/offload_groups.h"
#include "modules/trainer.h"

DEFINE_bool(dry_run, false,
            "print what this run needs on each pipeline rank of --dry_run_world_size ranks "
            "(parameters; weights, gradients, optimizer state, activations; the plan of "
            "--memory_budget_gib) and whether it fits devices of --dry_run_device_memory_gib, "
            "then exit: no mpirun, no device, nothing allocated; --device=auto means a GPU; "
            "files named by flags are not looked at");
DEFINE_int64(dry_run_world_size, 1,
             "the ranks --dry_run plans for (data parallel = this / --pipeline_parallel)");
DEFINE_double(dry_run_device_memory_gib, 80,
              "the memory of one device --dry_run plans for, GiB (a GPU's whole memory; with "
              "--device=cpu, a rank's share of its host's)");
DEFINE_bool(dry_run_json, false, "--dry_run prints its report as one JSON object");

namespace moe {
namespace {

// What a run would meet at start on the target: the estimate, the plan of its budget, and
// whether it fits (memory_check.h's checks; the plan's error with a budget).
struct Outcome {
  LayoutMemoryEstimate estimate;
  std::optional<MemoryPlan> plan;
  Status fit = Status::Ok();  // Ok: it fits; else why not
  double needed_bytes = 0;    // the busiest rank's: what the check counts, or the plan's peak
  int busiest_rank = 0;
};

// An error when the layout is not one (the run's refusal).
StatusOr<Outcome> Evaluate(const RunConfig& run, size_t capacity_bytes) {
  Outcome out;
  MOE_ASSIGN_OR_RETURN(out.estimate, EstimateRunMemory(run));
  const RankMemoryEstimate& busiest = out.estimate.busiest();
  out.busiest_rank = busiest.rank;
  out.needed_bytes = CheckedBytes(run, busiest);
  out.fit = CheckMemoryFits(run, out.estimate, capacity_bytes, /*ranks_sharing=*/1);
  if (!run.memory_budget || !out.fit.ok()) return out;
  // The plan moves activations only: a rank whose state alone exceeds the budget does not fit
  // (what the planner finds too, after trying every choice in every layer: seconds for 48).
  for (const RankMemoryEstimate& r : out.estimate.ranks) {
    if (r.memory.state_bytes <= run.memory_budget->bytes) continue;
    out.fit =
        InvalidArgument("--memory_budget_gib=" + FlagValueText("memory_budget_gib") +
                        ": the weights, gradients and optimizer state of pipeline rank " +
                        std::to_string(r.rank) + " alone take " + Bytes(r.memory.state_bytes));
    return out;
  }
  StatusOr<MemoryPlan> plan = PlanMemory(MemoryPlanRequestFor(run));
  if (!plan.ok()) {
    out.fit = plan.status();
    return out;
  }
  out.plan = std::move(plan).value();
  out.needed_bytes = 0;
  for (size_t rank = 0; rank < out.plan->ranks.size(); ++rank) {
    if (out.plan->ranks[rank].peak_bytes > out.needed_bytes) {
      out.needed_bytes = out.plan->ranks[rank].peak_bytes;
      out.busiest_rank = static_cast<int>(rank);
    }
  }
  return out;
}

struct Change {
  std::string flag;  // "--use_distributed_optimizer", "--pipeline_parallel=16", ...
  RunConfig run;
};

bool IsDefault(const char* flag) { return gflags::GetCommandLineFlagInfoOrDie(flag).is_default; }

// The single-flag changes tried when a layout does not fit, in the order the verdict prefers
// them: the distributed optimizer; a larger expert-parallel size (the smallest first: it divides
// the data size and the experts); a budget of the usable memory for the planner (when no flag
// that a budget refuses is set), or a budget lowered to it; smaller micro-batches; more pipeline
// stages (the world size stays). Each is checked as a run would check it; one that is not a
// layout is skipped.
std::vector<Change> Changes(const RunConfig& run, double usable_bytes) {
  std::vector<Change> out;
  if (!run.trainer.use_distributed_optimizer && run.data_parallel > 1) {
    Change c{"--use_distributed_optimizer", run};
    c.run.trainer.use_distributed_optimizer = true;
    out.push_back(std::move(c));
  }
  for (int expert = run.expert_parallel + 1; expert <= run.data_parallel; ++expert) {
    if (run.data_parallel % expert != 0 || !CheckExpertParallel(run.model, expert).ok()) continue;
    Change c{"--expert_model_parallel_size=" + std::to_string(expert), run};
    c.run.expert_parallel = expert;
    out.push_back(std::move(c));
  }
  const auto gib = static_cast<int64_t>(std::floor(usable_bytes / kGiB));
  if (!run.memory_budget && gib > 0 && IsDefault("offload_fraction") &&
      IsDefault("offload_pp_delta_bytes") && IsDefault("recompute_num_layers")) {
    Change c{"--memory_budget_gib=" + std::to_string(gib), run};
    StatusOr<std::optional<MemoryBudget>> budget = MakeMemoryBudget(
        static_cast<double>(gib), FLAGS_offload_modules, FLAGS_recompute_modules, run.model);
    StatusOr<std::optional<OffloadOptions>> offload =
        budget.ok() ? OffloadOptionsFromFlags(run.model, *budget)
                    : StatusOr<std::optional<OffloadOptions>>(budget.status());
    if (offload.ok()) {
      c.run.memory_budget = *budget;
      c.run.trainer.offload = *offload;
      out.push_back(std::move(c));
    }
  }
  if (run.memory_budget && run.memory_budget->bytes > usable_bytes && gib > 0) {
    Change c{"--memory_budget_gib=" + std::to_string(gib), run};
    c.run.memory_budget->bytes = static_cast<double>(gib) * kGiB;
    out.push_back(std::move(c));
  }
  for (int64_t micro = run.trainer.micro_batch_size - 1; micro >= 1; --micro) {
    if (run.trainer.micro_batch_size % micro != 0) continue;
    Change c{"--micro_batch_size=" + std::to_string(micro), run};
    c.run.trainer.micro_batch_size = micro;
    out.push_back(std::move(c));
  }
  const int world = run.pipeline_parallel * run.data_parallel;
  const auto most_stages = static_cast<int>(std::min<int64_t>(world, run.model.num_layers));
  for (int stages = run.pipeline_parallel + 1; stages <= most_stages; ++stages) {
    if (world % stages != 0 || (world / stages) % run.expert_parallel != 0) continue;
    Change c{"--pipeline_parallel=" + std::to_string(stages), run};
    c.run.pipeline_parallel = stages;
    c.run.data_parallel = world / stages;
    out.push_back(std::move(c));
  }
  return out;
}

// The first change that fits, as "--flag=value (then 61.2 GiB on the busiest rank)", or "".
std::string SmallestChange(const RunConfig& run, size_t capacity_bytes) {
  for (const Change& change : Changes(run, UsableBytes(run.device, capacity_bytes))) {
    StatusOr<Outcome> outcome = Evaluate(change.run, capacity_bytes);
    if (!outcome.ok() || !outcome->fit.ok()) continue;
    return change.flag + " (then " + Bytes(outcome->needed_bytes) + " on the busiest rank" +
           (change.run.memory_budget ? ", the plan's prediction" : "") + ")";
  }
  return "";
}

std::string GiBText(double gib) { return ShortestDouble(gib) + " GiB"; }

std::string Verdict(const RunConfig& run, const Outcome& outcome, size_t capacity_bytes) {
  const double usable = UsableBytes(run.device, capacity_bytes);
  const std::string device = GiBText(FLAGS_dry_run_device_memory_gib);
  const std::string where =
      outcome.estimate.ranks.size() > 1
          ? " on the busiest rank (pipeline rank " + std::to_string(outcome.busiest_rank) + ")"
          : " on each rank";
  if (outcome.fit.ok()) {
    return "fits in " + device + " (" + Bytes(usable) + " usable) with " +
           Bytes(usable - outcome.needed_bytes) + " to spare" + where +
           (outcome.plan
                ? " under the plan for --memory_budget_gib=" + FlagValueText("memory_budget_gib")
                : "");
  }
  std::string why = outcome.fit.message();
  if (!run.memory_budget) {
    why = "needs " + Bytes(outcome.needed_bytes) + where +
          (run.trainer.offload ? " (activations not counted: offloaded)" : "") + ", " +
          Bytes(outcome.needed_bytes - usable) + " more than the " + Bytes(usable) +
          " a run can use";
  }
  const std::string change = SmallestChange(run, capacity_bytes);
  return "does not fit in " + device + ": " + why + "; " +
         (change.empty() ? "no single change of --use_distributed_optimizer, "
                           "--expert_model_parallel_size, --memory_budget_gib, --micro_batch_size "
                           "or --pipeline_parallel fits"
                         : "smallest change that fits: " + change);
}

// "0-5", "7", "0-5, 12-17": layers as ranges.
std::string Ranges(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(layers[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(layers[j]);
    }
    i = j + 1;
  }
  return out;
}

// "emb 0-5", "6-11", "42-47 head", "emb 0-2, 12-14": a rank's stages.
std::string LayersText(const RankMemoryEstimate& r) {
  std::vector<int> layers;
  for (const LayerRange& range : r.chunks) {
    for (int l = range.begin; l < range.end; ++l) layers.push_back(l);
  }
  std::vector<std::string> parts;
  if (r.embedding) parts.push_back("emb");
  if (!layers.empty()) parts.push_back(Ranges(layers));
  if (r.head) parts.push_back("head");
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : " ") + part;
  return out;
}

std::string Count(double n) {
  char text[32];
  snprintf(text, sizeof(text), n >= 1e9 ? "%.2fB" : "%.2fM", n >= 1e9 ? n / 1e9 : n / 1e6);
  return text;
}

// What the plan chooses on `rank`: {"offload fused_group_mlp" -> layers, ...}, the offload
// groups, then the recompute modules, each in offload_groups.h's order.
std::vector<std::pair<std::string, std::vector<int>>> PlanChoices(const MemoryPlan& plan,
                                                                  int rank) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  for (const bool recompute : {false, true}) {
    for (const std::string& name : recompute ? RecomputeModuleNames() : OffloadGroupNames()) {
      std::vector<int> layers;
      for (const PlanRow& row : plan.rows) {
        if (row.rank == rank && row.chosen && row.is_recompute == recompute && row.name == name) {
          layers.push_back(row.layer);
        }
      }
      if (!layers.empty()) out.push_back({(recompute ? "recompute " : "offload ") + name, layers});
    }
  }
  return out;
}

// The plan's pinned host memory on its busiest rank (as a run reserves it); 0 without offloading.
double PinnedBytes(const RunConfig& run, const MemoryPlan& plan) {
  return run.trainer.offload ? PlanPinnedBytes(plan, run.trainer.offload->unpooled_groups) : 0;
}

void PrintText(const RunConfig& run, const Outcome& outcome, const std::string& verdict) {
  printf("dry run: %s; %s\n", ParallelSummary(run).c_str(), PrecisionSummary(run).c_str());
  printf("model: %s\n", ModelSummary(run.model).c_str());
  printf("parameters: %s\n", ParameterCounts(run.model).c_str());
  printf("batch: %s\n", BatchSummary(run).c_str());
  const std::vector<RankMemoryEstimate>& ranks = outcome.estimate.ranks;
  const bool gib = outcome.estimate.busiest().memory.total_bytes >= kGiB;
  const double unit = gib ? kGiB : kMiB;
  int width = 6;
  for (const RankMemoryEstimate& r : ranks) {
    width = std::max(width, static_cast<int>(LayersText(r).size()));
  }
  printf("per pipeline rank, %s (activations: of the passes in flight at their peak%s):\n",
         gib ? "GiB" : "MiB", run.model.recompute.any() ? ", with --recompute_modules" : "");
  printf("  %4s  %-*s  %10s  %9s  %9s  %9s  %11s  %9s  %9s  %9s\n", "rank", width, "layers",
         "parameters", "weights", "gradients", "optimizer", "activations", "in flight", "workspace",
         "total");
  for (const RankMemoryEstimate& r : ranks) {
    const MemoryEstimate& e = r.memory;
    printf("  %4d  %-*s  %10s  %9.2f  %9.2f  %9.2f  %11.2f  %9d  %9.2f  %9.2f\n", r.rank, width,
           LayersText(r).c_str(), Count(e.parameters).c_str(), r.weight_bytes / unit,
           r.gradient_bytes / unit, r.optimizer_bytes / unit, e.activation_bytes / unit,
           r.passes_in_flight, e.workspace_bytes / unit, e.total_bytes / unit);
  }
  printf("%s\n", MemoryEstimateLine(outcome.estimate, run.trainer.virtual_pipeline).c_str());
  if (outcome.plan) {
    const MemoryPlan& plan = *outcome.plan;
    printf("memory plan for --memory_budget_gib=%s (%.0f%% kept free):\n",
           FlagValueText("memory_budget_gib").c_str(), 100 * kPlanMargin);
    for (size_t rank = 0; rank < plan.ranks.size(); ++rank) {
      printf("%s\n", RankPlanLine(plan, static_cast<int>(rank)).c_str());
      std::string choices;
      for (const auto& [what, layers] : PlanChoices(plan, static_cast<int>(rank))) {
        choices += (choices.empty() ? "" : "; ") + what +
                   (layers.size() == 1 ? " in layer " : " in layers ") + Ranges(layers);
      }
      printf("          %s\n", choices.empty() ? "keeps everything" : choices.c_str());
    }
    if (const double pinned = PinnedBytes(run, plan); pinned > 0) {
      printf("  pinned host memory for its offloads: %s on the busiest rank\n",
             Bytes(pinned).c_str());
    }
  }
  printf("verdict: %s\n", verdict.c_str());
}

void PrintJson(const RunConfig& run, const Outcome& outcome, const std::string& verdict,
               size_t capacity_bytes) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankMemoryEstimate& r : outcome.estimate.ranks) {
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerRange& range : r.chunks) layers.push_back({range.begin, range.end});
    const MemoryEstimate& e = r.memory;
    ranks.push_back({{"rank", r.rank},
                     {"layers", layers},
                     {"embedding", r.embedding},
                     {"head", r.head},
                     {"parameters", e.parameters},
                     {"weight_bytes", r.weight_bytes},
                     {"gradient_bytes", r.gradient_bytes},
                     {"optimizer_bytes", r.optimizer_bytes},
                     {"activation_bytes", e.activation_bytes},
                     {"passes_in_flight", r.passes_in_flight},
                     {"workspace_bytes", e.workspace_bytes},
                     {"total_bytes", e.total_bytes}});
  }
  nlohmann::json out = {{"world_size", run.pipeline_parallel * run.data_parallel},
                        {"pipeline_parallel", run.pipeline_parallel},
                        {"data_parallel", run.data_parallel},
                        {"expert_parallel", run.expert_parallel},
                        {"virtual_pipeline", run.trainer.virtual_pipeline},
                        {"device", run.device.ToString()},
                        {"total_parameters", run.model.total_parameters()},
                        {"active_parameters", run.model.active_parameters()},
                        {"micro_batches", run.trainer.global_batch_size /
                                              (run.trainer.micro_batch_size * run.data_parallel)},
                        {"ranks", ranks},
                        {"device_memory_bytes", static_cast<double>(capacity_bytes)},
                        {"usable_bytes", UsableBytes(run.device, capacity_bytes)},
                        {"needed_bytes", outcome.needed_bytes},
                        {"busiest_rank", outcome.busiest_rank},
                        {"fits", outcome.fit.ok()},
                        {"verdict", verdict}};
  if (outcome.plan) {
    nlohmann::json plan_ranks = nlohmann::json::array();
    for (size_t rank = 0; rank < outcome.plan->ranks.size(); ++rank) {
      const RankPlanSummary& s = outcome.plan->ranks[rank];
      nlohmann::json choices = nlohmann::json::object();
      for (const auto& [what, layers] : PlanChoices(*outcome.plan, static_cast<int>(rank))) {
        choices[what] = layers;
      }
      plan_ranks.push_back({{"peak_bytes", s.peak_bytes},
                            {"baseline_peak_bytes", s.baseline_peak_bytes},
                            {"exposed_ms", s.exposed_ms},
                            {"choices", choices}});
    }
    out["plan"] = {{"budget_bytes", outcome.plan->budget_bytes},
                   {"pinned_host_bytes", PinnedBytes(run, *outcome.plan)},
                   {"ranks", plan_ranks}};
  }
  printf("%s\n", out.dump(2).c_str());
}

}  // namespace

Status DryRun() {
  MOE_ASSIGN_OR_RETURN(const RunConfig run,
                       ValidateFlags(static_cast<int>(FLAGS_dry_run_world_size), /*dry_run=*/true));
  const auto capacity_bytes = static_cast<size_t>(FLAGS_dry_run_device_memory_gib * kGiB);
  MOE_ASSIGN_OR_RETURN(const Outcome outcome, Evaluate(run, capacity_bytes));
  const std::string verdict = Verdict(run, outcome, capacity_bytes);
  if (FLAGS_dry_run_json) {
    PrintJson(run, outcome, verdict, capacity_bytes);
  } else {
    PrintText(run, outcome, verdict);
  }
  fflush(stdout);
  return Status::Ok();
}

}  // namespace moe
