#include "engine/optim/adamw.h"

#include <cmath>

#include "engine/distributed/host_collectives.h"

namespace moe {

StepReport AdamW::Step(ParameterSet& parameters, float lr, Communicator* model_group) {
  std::vector<Tensor> grads;
  for (const auto& p : parameters.all()) grads.push_back(MaterializedGrad(*p));
  Tensor norm = Tensor::Empty({1}, DType::kF32, parameters.device());
  ops::GlobalL2Norm(grads, norm);
  StepReport report;
  ops::CopyToHost(norm, &report.grad_norm);
  if (model_group != nullptr && model_group->size() > 1) {
    std::vector<float> squared = {report.grad_norm * report.grad_norm};
    AllReduceHostValues(model_group, squared);
    report.grad_norm = std::sqrt(squared[0]);
  }

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
  std::vector<ops::AdamWTensors> entries;
  for (const auto& p : parameters.all()) {
    const Tensor model = p->value.SharesStorageWith(p->master) ? Tensor() : p->value;
    entries.push_back(
        {p->master, MaterializedGrad(*p), p->exp_avg, p->exp_avg_sq, model, p->weight_decay});
  }
  ops::AdamWUpdate(entries, config);
  return report;
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
