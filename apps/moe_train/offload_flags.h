// moe_train's activation-memory flags (defined in offload_flags.cc): fine-grained activation
// offloading and selective recompute, and their validation against the model and each other. Every
// problem is one line naming the flag(s), found before any work; see DESIGN.md, "Fine-grained
// activation offloading".
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include <gflags/gflags.h>

#include "engine/core/status.h"
#include "engine/offload/offload_manager.h"
#include "modules/gpt_config.h"

DECLARE_string(offload_modules);
DECLARE_int64(offload_min_tensor_bytes);
DECLARE_double(offload_fraction);
DECLARE_int64(offload_pp_delta_bytes);
DECLARE_int64(offload_prefetch_layers);
DECLARE_string(recompute_modules);
DECLARE_int64(recompute_num_layers);
DECLARE_double(memory_budget_gib);

namespace moe {

struct OffloadFlagValues {
  std::string modules;  // comma list of group names; empty: no offloading
  int64_t min_tensor_bytes = 1 << 20;
  double fraction = 1.0;
  int64_t pp_delta_bytes = 0;
  int64_t prefetch_layers = 1;
  // --memory_budget_gib is on: the planner's candidate groups (instead of `modules`, which the
  // budget has read); the options get an (empty) planned policy for the plan.
  std::optional<std::set<std::string>> planned_groups;
};

// The candidates' list value meaning every eligible name (with --memory_budget_gib only).
inline constexpr char kAutoCandidates[] = "auto";

// --memory_budget_gib: the budget and what the planner (modules/memory_planner.h) may choose.
struct MemoryBudget {
  double bytes = 0;
  std::set<std::string> offload_candidates;    // group names
  std::set<std::string> recompute_candidates;  // recompute module names
};

// nullopt for `gib` 0 (then "auto" in a list is an error); else the lists as candidates: "auto"
// is every eligible name, and two empty lists are both "auto".
StatusOr<std::optional<MemoryBudget>> MakeMemoryBudget(double gib, const std::string& offload_list,
                                                       const std::string& recompute_list,
                                                       const GptConfig& model);
StatusOr<std::optional<MemoryBudget>> MemoryBudgetFromFlags(const GptConfig& model);

// The manager's options for `values` and `model`, nullopt when no module is listed, or the first
// problem.
StatusOr<std::optional<OffloadOptions>> MakeOffloadOptions(const OffloadFlagValues& values,
                                                           const GptConfig& model);
// The same from the command-line flags; with `budget`, its offload candidates, planned.
StatusOr<std::optional<OffloadOptions>> OffloadOptionsFromFlags(
    const GptConfig& model, const std::optional<MemoryBudget>& budget);

// --recompute_modules's list, checked against the offload options chosen (nullopt: none).
StatusOr<RecomputeModules> MakeRecompute(const std::string& list,
                                         const std::optional<OffloadOptions>& offload);
// The same from the command-line flag.
StatusOr<RecomputeModules> RecomputeFromFlags(const std::optional<OffloadOptions>& offload);
// --recompute_num_layers: -1 (every layer) or a layer count of `model`.
StatusOr<int64_t> RecomputeNumLayers(int64_t value, const GptConfig& model);
StatusOr<int64_t> RecomputeNumLayersFromFlags(const GptConfig& model);

}  // namespace moe
