// AdamW over a ParameterSet: global gradient-norm clipping, then a decoupled-weight-decay Adam
// step on the f32 masters (weight decay only where Parameter::weight_decay), then value = master.
// The learning rate comes from the schedule (LearningRate, below). Gradients are left as they are:
// the caller zeroes them before the next accumulation. When the model is split over a group of
// ranks (pipeline stages, each with its own parameters), the squared norms are summed over the
// group, so every rank clips by the whole model's norm.
#pragma once

#include "engine/autograd/parameters.h"
#include "engine/distributed/communicator.h"
#include "engine/kernels/ops.h"

namespace moe {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip_grad = 1.0f;  // max global L2 norm; <= 0 disables clipping
};

struct StepReport {
  float grad_norm = 0;  // before clipping
};

class AdamW {
 public:
  explicit AdamW(const AdamWOptions& options) : options_(options) {}

  // One step at learning rate `lr`. Reads the gradient norm back to the host (one sync).
  // model_group: the ranks the model is split over (nullptr: this rank holds all of it).
  StepReport Step(ParameterSet& parameters, float lr, Communicator* model_group = nullptr);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

 private:
  AdamWOptions options_;
  int64_t step_ = 0;  // completed steps
};

// Linear warmup from 0 to `lr` over `warmup_steps`, then cosine decay to `min_lr` at
// `total_steps`; constant `min_lr` after. `step` counts from 0.
float LearningRate(int64_t step, float lr, float min_lr, int64_t warmup_steps, int64_t total_steps);

}  // namespace moe
