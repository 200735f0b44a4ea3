#include "modules/grouped_mlp.h"

#include <cmath>

#include <glog/logging.h>

#include "engine/kernels/ops.h"
#include "modules/fused_grouped_mlp.h"
#include "modules/unfused_grouped_mlp.h"

namespace moe {

std::unique_ptr<GroupedMlp> MakeGroupedMlp(ParameterSet& parameters, const std::string& name,
                                           const GptConfig& config, int layer) {
  switch (config.moe_grouped_mlp) {
    case GroupedMlpKind::kFused:
      return std::make_unique<FusedGroupedMlp>(parameters, name, config, layer);
    case GroupedMlpKind::kUnfused:
      return std::make_unique<UnfusedGroupedMlp>(parameters, name, config, layer);
  }
  LOG(FATAL) << "unknown grouped MLP kind " << static_cast<int>(config.moe_grouped_mlp);
}

GroupedMlp::GroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                       int layer)
    : name_(name),
      config_(config),
      layer_(layer),
      fc1_(parameters.Create(
          {name + ".fc1.weight",
           {config.num_experts, 2 * config.moe_ffn_hidden_size, config.hidden_size},
           Init::kNormal,
           config.init_std})),
      fc2_(parameters.Create(
          {name + ".fc2.weight",
           {config.num_experts, config.hidden_size, config.moe_ffn_hidden_size},
           Init::kNormal,
           config.init_std / std::sqrt(2.0f * static_cast<float>(config.num_layers))})) {}

Tensor ExpertMatrix(const Parameter& p, const Tensor& stacked, int64_t expert) {
  return stacked.Rows(expert, expert + 1).View({p.value.dim(1), p.value.dim(2)});
}

Tensor HostOffsets(const Tensor& offsets) {
  Tensor host = Tensor::Empty({offsets.numel()}, DType::kI32, Device::CPU());
  ops::CopyToHost(offsets, host.data<int32_t>());
  return host;
}

std::span<const int32_t> OffsetValues(const Tensor& host_offsets) {
  if (!host_offsets.defined()) return {};
  CHECK(host_offsets.device() == Device::CPU()) << "offsets not on the host";
  return host_offsets.values<int32_t>();
}

}  // namespace moe
