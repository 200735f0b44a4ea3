#include "modules/offload_groups.h"

#include <algorithm>
#include <sstream>

#include <glog/logging.h>

namespace moe {

const std::vector<std::string>& OffloadGroupNames() {
  static const std::vector<std::string> names = {
      kAttnNormGroup, kQkvLinearGroup, kCoreAttnGroup, kAttnProjGroup,
      kMlpNormGroup,  kExpertFc1Group, kMoeActGroup,   kFusedGroupMlpGroup};
  return names;
}

const std::set<std::string>& RoutedOffloadGroups() {
  static const std::set<std::string> names = {kExpertFc1Group, kMoeActGroup, kFusedGroupMlpGroup};
  return names;
}

std::set<std::string> EligibleOffloadGroups(GroupedMlpKind mlp) {
  std::set<std::string> out(OffloadGroupNames().begin(), OffloadGroupNames().end());
  if (mlp == GroupedMlpKind::kFused) {
    out.erase(kExpertFc1Group);
    out.erase(kMoeActGroup);
  } else {
    out.erase(kFusedGroupMlpGroup);
  }
  return out;
}

Status CheckOffloadGroups(const std::set<std::string>& groups, GroupedMlpKind mlp,
                          const std::string& flag) {
  const auto has = [&](const char* group) { return groups.count(group) > 0; };
  const bool fused = mlp == GroupedMlpKind::kFused;
  if (has(kAttnProjGroup) && !has(kCoreAttnGroup)) {
    return InvalidArgument(flag + ": " + kAttnProjGroup + " needs " + kCoreAttnGroup +
                           " (the attention output it moves is read by core attention's backward "
                           "too); add " +
                           kCoreAttnGroup + " or drop " + kAttnProjGroup);
  }
  for (const char* unfused_group : {kExpertFc1Group, kMoeActGroup}) {
    if (has(kFusedGroupMlpGroup) && has(unfused_group)) {
      return InvalidArgument(flag + ": " + kFusedGroupMlpGroup + " cannot be combined with " +
                             unfused_group + " (" + kFusedGroupMlpGroup +
                             " already holds the fc1 and activation inputs)");
    }
  }
  if (has(kFusedGroupMlpGroup) && !fused) {
    return InvalidArgument(flag + "=" + kFusedGroupMlpGroup +
                           " needs --moe_grouped_mlp=fused; with the unfused grouped MLP use " +
                           kExpertFc1Group + " and/or " + kMoeActGroup);
  }
  for (const char* unfused_group : {kExpertFc1Group, kMoeActGroup}) {
    if (fused && has(unfused_group)) {
      return InvalidArgument(flag + "=" + unfused_group +
                             " does not exist with --moe_grouped_mlp=fused: offload " +
                             kFusedGroupMlpGroup + " instead, or use --moe_grouped_mlp=unfused");
    }
  }
  return Status::Ok();
}

const std::vector<std::string>& RecomputeModuleNames() {
  static const std::vector<std::string> names = {kLayerNormRecompute, kMoeActRecompute,
                                                 kMoeRecompute, kCoreAttnRecompute};
  return names;
}

bool RecomputeModules::*RecomputeMember(const std::string& name) {
  if (name == kLayerNormRecompute) return &RecomputeModules::layernorm;
  if (name == kMoeActRecompute) return &RecomputeModules::moe_act;
  if (name == kMoeRecompute) return &RecomputeModules::moe;
  CHECK_EQ(name, kCoreAttnRecompute) << "not a recompute module";
  return &RecomputeModules::core_attn;
}

StatusOr<RecomputeModules> MakeRecomputeModules(const std::set<std::string>& names,
                                                const std::string& flag) {
  RecomputeModules r;
  for (const std::string& name : names) r.*RecomputeMember(name) = true;
  if (r.moe && r.moe_act) {
    return InvalidArgument(flag + ": " + kMoeRecompute + " already recomputes " + kMoeActRecompute +
                           "; list one of them");
  }
  return r;
}

Status CheckRecomputeWithOffload(const RecomputeModules& recompute,
                                 const std::set<std::string>& offload_groups) {
  const char* const modules[] = {kLayerNormRecompute, kCoreAttnRecompute, kMoeRecompute,
                                 kMoeActRecompute};  // the order conflicts are reported in
  const auto conflicts = [](const std::string& module) -> std::vector<const char*> {
    if (module == kLayerNormRecompute) return {kAttnNormGroup, kMlpNormGroup, kQkvLinearGroup};
    if (module == kCoreAttnRecompute) return {kCoreAttnGroup, kAttnProjGroup};
    if (module == kMoeRecompute) return {kFusedGroupMlpGroup, kExpertFc1Group, kMoeActGroup};
    return {kMoeActGroup};
  };
  for (const char* module : modules) {
    if (!(recompute.*RecomputeMember(module))) continue;
    for (const char* group : conflicts(module)) {
      if (offload_groups.count(group)) {
        return InvalidArgument(
            std::string("--recompute_modules=") + module +
            " cannot be combined with --offload_modules=" + group + " (" +
            (std::string(module) == group
                 ? "a module is either recomputed or offloaded"
                 : std::string(module) + " recompute reads or drops what " + group + " holds") +
            ")");
      }
    }
  }
  return Status::Ok();
}

StatusOr<std::set<std::string>> ParseNameList(const std::string& list,
                                              const std::vector<std::string>& known,
                                              const std::string& flag) {
  std::set<std::string> chosen;
  if (list.empty()) return chosen;
  if (list.back() == ',') return InvalidArgument("--" + flag + "=" + list + " has an empty entry");
  std::stringstream entries(list);
  std::string name;
  while (std::getline(entries, name, ',')) {
    if (name.empty()) return InvalidArgument("--" + flag + "=" + list + " has an empty entry");
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string choices;
      for (const std::string& k : known) choices += (choices.empty() ? "" : ", ") + k;
      return InvalidArgument("--" + flag + ": unknown module \"" + name + "\"; choose from " +
                             choices);
    }
    if (!chosen.insert(name).second)
      return InvalidArgument("--" + flag + " lists " + name + " twice");
  }
  return chosen;
}

}  // namespace moe
