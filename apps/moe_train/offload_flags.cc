#include "apps/moe_train/offload_flags.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/core/byte_units.h"
#include "modules/offload_groups.h"

DEFINE_string(offload_modules, "",
              "comma list of activation groups to offload to pinned host memory: attn_norm, "
              "qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act (unfused grouped "
              "MLP), fused_group_mlp (fused grouped MLP); empty: off");
DEFINE_int64(offload_min_tensor_bytes, 1 << 20,
             "saved tensors smaller than this stay on the device");
DEFINE_double(offload_fraction, 1.0,
              "fraction of the offload groups (layer x module) kept offloaded, earliest in "
              "forward order first");
DEFINE_int64(offload_pp_delta_bytes, 0,
             "pipeline rank r keeps r x this many bytes of its last offload groups on the device");
DEFINE_string(recompute_modules, "",
              "comma list of modules that drop activations in forward and recompute them in "
              "backward: layernorm (the norms' outputs), moe_act (the SwiGLU output), moe (the "
              "whole MoE layer from its input), core_attn (attention from q, k, v); empty: off");
DEFINE_int64(recompute_num_layers, -1,
             "recompute --recompute_modules only in the first N layers of the model");
DEFINE_double(memory_budget_gib, 0,
              "device memory the run may use, GiB: the planner chooses per layer which of "
              "--offload_modules and --recompute_modules to offload, recompute or keep (auto, or "
              "both empty: every one) for the least step time");
DEFINE_int64(offload_prefetch_layers, 1,
             "how many layers ahead of backward reloads run (0: on demand)");

namespace moe {

StatusOr<std::optional<OffloadOptions>> MakeOffloadOptions(const OffloadFlagValues& values,
                                                           const GptConfig& model) {
  if (values.min_tensor_bytes < 0) {
    return InvalidArgument("--offload_min_tensor_bytes=" + std::to_string(values.min_tensor_bytes) +
                           " must not be negative");
  }
  if (!(values.fraction >= 0 && values.fraction <= 1)) {
    std::ostringstream text;
    text << values.fraction;
    return InvalidArgument("--offload_fraction=" + text.str() + " must be in [0, 1]");
  }
  if (values.pp_delta_bytes < 0) {
    return InvalidArgument("--offload_pp_delta_bytes=" + std::to_string(values.pp_delta_bytes) +
                           " must not be negative");
  }
  if (values.prefetch_layers < 0 || values.prefetch_layers > model.num_layers) {
    return InvalidArgument("--offload_prefetch_layers=" + std::to_string(values.prefetch_layers) +
                           " must be in [0, --num_layers=" + std::to_string(model.num_layers) +
                           "]");
  }

  std::set<std::string> chosen;
  if (values.planned_groups) {
    chosen = *values.planned_groups;
  } else {
    MOE_ASSIGN_OR_RETURN(chosen,
                         ParseNameList(values.modules, OffloadGroupNames(), "offload_modules"));
  }
  if (chosen.empty()) return std::optional<OffloadOptions>();
  MOE_RETURN_IF_ERROR(CheckOffloadGroups(chosen, model.moe_grouped_mlp, "--offload_modules"));

  OffloadOptions options;
  options.groups = chosen;
  for (const std::string& group : RoutedOffloadGroups()) {
    if (chosen.count(group)) options.unpooled_groups.insert(group);
  }
  options.min_tensor_bytes = values.min_tensor_bytes;
  options.fraction = values.fraction;
  options.pp_delta_bytes = values.pp_delta_bytes;
  options.prefetch_layers = static_cast<int>(values.prefetch_layers);
  if (values.planned_groups) options.planned.emplace();
  return std::optional<OffloadOptions>(std::move(options));
}

StatusOr<std::optional<OffloadOptions>> OffloadOptionsFromFlags(
    const GptConfig& model, const std::optional<MemoryBudget>& budget) {
  OffloadFlagValues values;
  values.modules = FLAGS_offload_modules;
  if (budget) values.planned_groups = budget->offload_candidates;
  values.min_tensor_bytes = FLAGS_offload_min_tensor_bytes;
  values.fraction = FLAGS_offload_fraction;
  values.pp_delta_bytes = FLAGS_offload_pp_delta_bytes;
  values.prefetch_layers = FLAGS_offload_prefetch_layers;
  return MakeOffloadOptions(values, model);
}

StatusOr<std::optional<MemoryBudget>> MakeMemoryBudget(double gib, const std::string& offload_list,
                                                       const std::string& recompute_list,
                                                       const GptConfig& model) {
  if (gib == 0) {
    for (const auto& [flag, list] :
         {std::pair<const char*, const std::string&>{"offload_modules", offload_list},
          {"recompute_modules", recompute_list}}) {
      if (list == kAutoCandidates) {
        return InvalidArgument(std::string("--") + flag + "=" + kAutoCandidates +
                               " needs --memory_budget_gib (the planner chooses among them)");
      }
    }
    return std::optional<MemoryBudget>();
  }
  if (!(gib > 0) || !std::isfinite(gib)) {
    std::ostringstream text;
    text << gib;
    return InvalidArgument("--memory_budget_gib=" + text.str() + " must be positive (0: off)");
  }
  MemoryBudget budget;
  budget.bytes = gib * kGiB;
  const bool both_auto = offload_list.empty() && recompute_list.empty();
  if (both_auto || offload_list == kAutoCandidates) {
    budget.offload_candidates = EligibleOffloadGroups(model.moe_grouped_mlp);
  } else {
    MOE_ASSIGN_OR_RETURN(budget.offload_candidates,
                         ParseNameList(offload_list, OffloadGroupNames(), "offload_modules"));
    MOE_RETURN_IF_ERROR(
        CheckOffloadGroups(budget.offload_candidates, model.moe_grouped_mlp, "--offload_modules"));
  }
  if (both_auto || recompute_list == kAutoCandidates) {
    budget.recompute_candidates = {RecomputeModuleNames().begin(), RecomputeModuleNames().end()};
  } else {
    MOE_ASSIGN_OR_RETURN(
        budget.recompute_candidates,
        ParseNameList(recompute_list, RecomputeModuleNames(), "recompute_modules"));
  }
  return std::optional<MemoryBudget>(std::move(budget));
}

StatusOr<std::optional<MemoryBudget>> MemoryBudgetFromFlags(const GptConfig& model) {
  return MakeMemoryBudget(FLAGS_memory_budget_gib, FLAGS_offload_modules, FLAGS_recompute_modules,
                          model);
}

StatusOr<RecomputeModules> MakeRecompute(const std::string& list,
                                         const std::optional<OffloadOptions>& offload) {
  MOE_ASSIGN_OR_RETURN(const std::set<std::string> names,
                       ParseNameList(list, RecomputeModuleNames(), "recompute_modules"));
  MOE_ASSIGN_OR_RETURN(const RecomputeModules recompute,
                       MakeRecomputeModules(names, "--recompute_modules"));
  if (offload) MOE_RETURN_IF_ERROR(CheckRecomputeWithOffload(recompute, offload->groups));
  return recompute;
}

StatusOr<RecomputeModules> RecomputeFromFlags(const std::optional<OffloadOptions>& offload) {
  return MakeRecompute(FLAGS_recompute_modules, offload);
}

StatusOr<int64_t> RecomputeNumLayers(int64_t value, const GptConfig& model) {
  if (value == -1 || (value >= 1 && value <= model.num_layers)) return value;
  return InvalidArgument(
      "--recompute_num_layers=" + std::to_string(value) +
      " must be -1 (every layer) or in [1, --num_layers=" + std::to_string(model.num_layers) + "]");
}

StatusOr<int64_t> RecomputeNumLayersFromFlags(const GptConfig& model) {
  return RecomputeNumLayers(FLAGS_recompute_num_layers, model);
}

}  // namespace moe
