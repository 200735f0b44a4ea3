#include "engine/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include <glog/logging.h>

#include "engine/distributed/host_collectives.h"

namespace moe {

namespace {

// The sum over the group's ranks of their `value`s, in rank order (every rank gets the same).
double SumOverGroup(Communicator* group, double value) {
  double sum = 0;
  for (double v : AllGatherHost(group, std::vector<double>{value})) sum += v;
  return sum;
}

// The squared L2 norm of the gradients of `slices` of replica group `group`, in double.
double SquaredNorm(const std::vector<OwnedSlice>& slices, ReplicaGroup group, Device device) {
  std::vector<Tensor> grads;
  for (const OwnedSlice& s : slices) {
    if (s.replicas == group) grads.push_back(s.grad);
  }
  Tensor norm = Tensor::Empty({1}, DType::kF32, device);
  ops::GlobalL2Norm(grads, norm);
  float owned_norm = 0;
  ops::CopyToHost(norm, &owned_norm);
  return static_cast<double>(owned_norm) * owned_norm;
}

}  // namespace

StepReport AdamW::Step(ParameterSet& parameters, float lr, const NormGroups& groups) {
  parameters.MarkValuesChanged();
  for (ReplicaGroup group : kReplicaGroups) {
    const Communicator* shard = groups.shard[group];
    CHECK_EQ(parameters.shards(group), shard != nullptr ? shard->size() : 1)
        << "the " << ReplicaGroupName(group)
        << " group's optimizer state shards and its shard group differ";
  }
  for (const auto& p : parameters.all()) MaterializedGrad(*p);
  const std::vector<OwnedSlice> slices = parameters.OwnedSlices();
  const Device device = parameters.device();
  double squared =
      SumOverGroup(groups.shard.data, SquaredNorm(slices, ReplicaGroup::kData, device));
  // Every rank of the expert and shard groups holds the same parameter specs: all of them sum.
  const auto& specs = parameters.specs();
  if (std::any_of(specs.begin(), specs.end(), [](const ParameterSpec& spec) {
        return spec.replicas == ReplicaGroup::kExpertData;
      })) {
    const double expert = SquaredNorm(slices, ReplicaGroup::kExpertData, device);
    squared += SumOverGroup(groups.expert, SumOverGroup(groups.shard.expert_data, expert));
  }
  squared = SumOverGroup(groups.model, squared);
  StepReport report;
  report.grad_norm = static_cast<float>(std::sqrt(squared));

  ++step_;
  ops::AdamWConfig config;
  config.lr = lr;
  config.beta1 = options_.beta1;
  config.beta2 = options_.beta2;
  config.eps = options_.eps;
  config.step = step_;
  config.grad_scale = 1.0f;
  if (options_.clip_grad > 0 && report.grad_norm > options_.clip_grad) {
    config.grad_scale = options_.clip_grad / (report.grad_norm + 1e-6f);
  }
  config.weight_decay = options_.weight_decay;
  ops::AdamWUpdate(AdamWUpdateEntries(slices), config);
  return report;
}

std::vector<ops::AdamWTensors> AdamWUpdateEntries(const std::vector<OwnedSlice>& slices) {
  std::vector<ops::AdamWTensors> entries;
  for (const OwnedSlice& s : slices) {
    const Tensor model = s.value.SharesStorageWith(s.master) ? Tensor() : s.value;
    entries.push_back(
        {s.master, s.grad, s.exp_avg, s.exp_avg_sq, model, s.parameter->weight_decay});
  }
  return entries;
}

float LearningRate(int64_t step, float lr, float min_lr, int64_t warmup_steps,
                   int64_t total_steps) {
  if (step < warmup_steps)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return static_cast<float>(min_lr + (lr - min_lr) * cosine);
}

}  // namespace moe
