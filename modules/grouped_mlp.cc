#include "modules/grouped_mlp.h"

#include <cmath>

#include <glog/logging.h>

#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "modules/fused_grouped_mlp.h"
#include "modules/unfused_grouped_mlp.h"

namespace moe {

namespace {

// One expert weight of `shard`'s experts: rows [first, first + count) of the whole (experts, rows,
// cols) tensor, or the whole one.
ParameterSpec ExpertWeightSpec(const std::string& name, const GptConfig& config,
                               const ExpertShard& shard, int64_t rows, int64_t cols, float std) {
  ParameterSpec spec{name, {config.num_experts, rows, cols}, Init::kNormal, std};
  if (shard.count == 0 || shard.count == config.num_experts) return spec;
  spec.whole_shape = spec.shape;
  spec.shape[0] = shard.count;
  spec.first_row = shard.first;
  spec.replicas = ReplicaGroup::kExpertData;
  return spec;
}

}  // namespace

std::unique_ptr<GroupedMlp> MakeGroupedMlp(ParameterSet& parameters, const std::string& name,
                                           const GptConfig& config, int layer,
                                           const ExpertShard& shard) {
  switch (config.moe_grouped_mlp) {
    case GroupedMlpKind::kFused:
      return std::make_unique<FusedGroupedMlp>(parameters, name, config, layer, shard);
    case GroupedMlpKind::kUnfused:
      return std::make_unique<UnfusedGroupedMlp>(parameters, name, config, layer, shard);
  }
  LOG(FATAL) << "unknown grouped MLP kind " << static_cast<int>(config.moe_grouped_mlp);
}

GroupedMlp::GroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                       int layer, const ExpertShard& shard)
    : parameters_(parameters),
      name_(name),
      config_(config),
      layer_(layer),
      shard_(shard),
      fc1_(parameters.Create(ExpertWeightSpec(name + ".fc1.weight", config, shard,
                                              2 * config.moe_ffn_hidden_size, config.hidden_size,
                                              config.init_std))),
      fc2_(parameters.Create(ExpertWeightSpec(
          name + ".fc2.weight", config, shard, config.hidden_size, config.moe_ffn_hidden_size,
          config.init_std / std::sqrt(2.0f * static_cast<float>(config.num_layers))))) {
  CHECK(shard.sources >= 1) << name << ": " << shard.sources << " row sources";
}

Tensor PermutedRows::Gathered() const {
  if (!index.defined()) return values;
  Tensor out = Tensor::Empty({index.dim(0), values.dim(1)}, values.dtype(), values.device());
  ops::GatherRows(values, index, out);
  return out;
}

GroupedMlp::Grads GroupedMlp::Backward(SavedTensors& saved, const PermutedRows& dy,
                                       bool last_of_step) {
  Grads grads = BackwardSegment(saved, dy, 0);
  EndBackward(last_of_step);
  return grads;
}

std::string GroupedMlp::Key(const char* what, int segment) const {
  return segment == 0 ? name_ + what : name_ + ".source" + std::to_string(segment) + what;
}

bool ExpertGradsSummedByModule(Device device, bool expert_parallel) {
  return expert_parallel && !device.is_cuda();
}

GroupedMlp::Slots& GroupedMlp::SlotsOf(const Parameter& w) {
  Slots& slots = &w == &fc1_ ? fc1_slots_ : fc2_slots_;
  if (slots.grads.empty()) {
    const int64_t numel = w.grad.numel();
    slots.all = Tensor::Empty({shard_.sources, numel}, w.grad.dtype(), w.grad.device());
    for (int s = 0; s < shard_.sources; ++s) {
      slots.grads.push_back(slots.all.Rows(s, s + 1).View(w.grad.shape()));
    }
    slots.written.assign(shard_.sources, false);
  }
  return slots;
}

bool GroupedMlp::UsesGradSlots() const {
  return ExpertGradsSummedByModule(fc1_.value.device(), shard_.sources > 1);
}

GroupedMlp::GradTarget GroupedMlp::WeightGradTarget(Parameter& w, int segment) {
  if (!UsesGradSlots()) return {w.grad, BeginGradWrite(w)};
  Slots& slots = SlotsOf(w);
  const bool accumulate = slots.written[segment];
  slots.written[segment] = true;
  return {slots.grads[segment], accumulate};
}

void GroupedMlp::SumGradSlots() {
  if (!UsesGradSlots()) return;
  Communicator* group = shard_.expert_data;
  const int ranks = group != nullptr ? group->size() : 1;
  for (Parameter* w : {&fc1_, &fc2_}) {
    Slots& slots = SlotsOf(*w);  // every rank of the group takes part, with rows or not
    CHECK(!BeginGradWrite(*w)) << w->name << ": gradient written beside its source slots";
    for (size_t s = 0; s < slots.grads.size(); ++s) {
      if (!slots.written[s]) ops::Fill(slots.grads[s], 0.0f);
      slots.written[s] = false;
    }
    // Every source rank's partial gradient, in data-rank order: rank g of the expert-data group
    // holds those of data ranks g * sources ... (g + 1) * sources - 1.
    Tensor partials = slots.all;
    if (ranks > 1) {
      partials = Tensor::Empty({ranks * slots.all.dim(0), slots.all.dim(1)}, slots.all.dtype(),
                               slots.all.device());
      EnqueueBetween(*group, DeviceContext::Get(group->device()).compute_stream(),
                     [&] { group->AllGather(slots.all, partials); });
    }
    // As the CPU all-reduce adds: in f32, rank by rank, rounded to the gradient's dtype once.
    const Tensor sum = Tensor::Empty({partials.dim(1)}, DType::kF32, partials.device());
    const Tensor part = Tensor::Empty({partials.dim(1)}, DType::kF32, partials.device());
    for (int64_t r = 0; r < partials.dim(0); ++r) {
      ops::Cast(partials.Rows(r, r + 1).View({partials.dim(1)}), r == 0 ? sum : part);
      if (r > 0) ops::Add(sum, part, sum);
    }
    ops::Cast(sum, w->grad.View({w->grad.numel()}));
  }
}

Tensor ExpertMatrix(const Parameter& p, const Tensor& stacked, int64_t expert) {
  return stacked.Rows(expert, expert + 1).View({p.value.dim(1), p.value.dim(2)});
}

Tensor HostOffsets(const Tensor& offsets, const Tensor& known) {
  if (known.defined()) return known;
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
