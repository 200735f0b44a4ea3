#include "modules/offload_groups.h"

namespace moe {

const std::vector<std::string>& OffloadGroupNames() {
  static const std::vector<std::string> names = {"attn_norm", "qkv_linear", "core_attn",
                                                 "attn_proj", "mlp_norm",   "expert_fc1",
                                                 "moe_act",   "fused_group_mlp"};
  return names;
}

const std::set<std::string>& RoutedOffloadGroups() {
  static const std::set<std::string> names = {"expert_fc1", "moe_act", "fused_group_mlp"};
  return names;
}

}  // namespace moe
