#include "apps/moe_train/offload_flags.h"

#include <algorithm>
#include <sstream>

#include "modules/offload_groups.h"

DEFINE_string(offload_modules, "",
              "comma list of activation groups to offload to pinned host memory: attn_norm, "
              "qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act (unfused grouped "
              "MLP), fused_group_mlp (fused grouped MLP); empty: off");
DEFINE_int64(offload_min_tensor_bytes, 1 << 20, "saved tensors smaller than this stay on the device");
DEFINE_double(offload_fraction, 1.0,
              "fraction of the offload groups (layer x module) kept offloaded, earliest in "
              "forward order first, in [0, 1]");
DEFINE_int64(offload_pp_delta_bytes, 0,
              "pipeline rank r keeps r x this many bytes of its last offload groups on the device");
DEFINE_int64(offload_prefetch_layers, 1,
             "how many layers ahead of backward reloads run (0: on demand), in [0, --num_layers]");

namespace moe {
namespace {

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

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
                           " must be in [0, --num_layers=" + std::to_string(model.num_layers) + "]");
  }

  const std::vector<std::string>& known = OffloadGroupNames();
  std::set<std::string> chosen;
  std::stringstream list(values.modules);
  std::string name;
  while (!values.modules.empty() && std::getline(list, name, ',')) {
    if (name.empty()) {
      return InvalidArgument("--offload_modules=" + values.modules + " has an empty entry");
    }
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return InvalidArgument("--offload_modules: unknown module \"" + name + "\"; choose from " +
                             Join(known));
    }
    if (!chosen.insert(name).second) {
      return InvalidArgument("--offload_modules lists " + name + " twice");
    }
  }
  if (!values.modules.empty() && values.modules.back() == ',') {
    return InvalidArgument("--offload_modules=" + values.modules + " has an empty entry");
  }
  if (chosen.empty()) return std::optional<OffloadOptions>();

  RETURN_IF_ERROR(CheckOffloadGroups(chosen, model.moe_grouped_mlp, "--offload_modules"));

  OffloadOptions options;
  options.groups = chosen;
  for (const std::string& group : RoutedOffloadGroups()) {
    if (chosen.count(group)) options.unpooled_groups.insert(group);
  }
  options.min_tensor_bytes = values.min_tensor_bytes;
  options.fraction = values.fraction;
  options.pp_delta_bytes = values.pp_delta_bytes;
  options.prefetch_layers = static_cast<int>(values.prefetch_layers);
  return std::optional<OffloadOptions>(std::move(options));
}

StatusOr<std::optional<OffloadOptions>> OffloadOptionsFromFlags(const GptConfig& model) {
  OffloadFlagValues values;
  values.modules = FLAGS_offload_modules;
  values.min_tensor_bytes = FLAGS_offload_min_tensor_bytes;
  values.fraction = FLAGS_offload_fraction;
  values.pp_delta_bytes = FLAGS_offload_pp_delta_bytes;
  values.prefetch_layers = FLAGS_offload_prefetch_layers;
  return MakeOffloadOptions(values, model);
}

}  // namespace moe
