#include "modules/offload_groups.h"

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

Status CheckOffloadGroups(const std::set<std::string>& groups, GroupedMlpKind mlp,
                          const std::string& flag) {
  const auto has = [&](const char* group) { return groups.count(group) > 0; };
  const bool fused = mlp == GroupedMlpKind::kFused;
  if (has(kAttnProjGroup) && !has(kCoreAttnGroup)) {
    return InvalidArgument(flag + ": " + kAttnProjGroup + " needs " + kCoreAttnGroup +
                           " (the attention output it moves is read by core attention's backward "
                           "too); add " + kCoreAttnGroup + " or drop " + kAttnProjGroup);
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

}  // namespace moe
