#include "modules/grouped_mlp.h"

#include <cmath>

#include "engine/kernels/ops.h"
#include "modules/unfused_grouped_mlp.h"

namespace moe {

std::unique_ptr<GroupedMlp> MakeGroupedMlp(ParameterSet& parameters, const std::string& name,
                                           const GptConfig& config, int layer) {
  return std::make_unique<UnfusedGroupedMlp>(parameters, name, config, layer);
}

ExpertWeights CreateExpertWeights(ParameterSet& parameters, const std::string& name,
                                  const GptConfig& config) {
  const float fc2_std = config.init_std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  return {parameters.Create({name + ".fc1.weight",
                             {config.num_experts, 2 * config.moe_ffn_hidden_size, config.hidden_size},
                             Init::kNormal, config.init_std}),
          parameters.Create({name + ".fc2.weight",
                             {config.num_experts, config.hidden_size, config.moe_ffn_hidden_size},
                             Init::kNormal, fc2_std})};
}

Tensor ExpertMatrix(const Parameter& p, const Tensor& stacked, int64_t expert) {
  return stacked.Rows(expert, expert + 1).View({p.master.dim(1), p.master.dim(2)});
}

std::vector<int32_t> HostOffsets(const Tensor& offsets) {
  std::vector<int32_t> host(offsets.numel());
  ops::CopyToHost(offsets, host.data());
  return host;
}

}  // namespace moe
