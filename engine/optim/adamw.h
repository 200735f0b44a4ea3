// AdamW over a ParameterSet: global gradient-norm clipping, then a decoupled-weight-decay Adam
// step on the f32 masters (weight decay only where Parameter::weight_decay), then value = master.
// The learning rate comes from the schedule (LearningRate, below). Gradients are left as they are:
// the caller zeroes them before the next accumulation.
//
// A rank updates what it owns (ParameterSet::OwnedSlices): every parameter, or under a state
// sharded over the replica groups its part of every bucket, whose new values it writes to its part
// of the value buffers (the caller all-gathers them, weight_gather.h). The norm is exact over the
// whole model: each rank takes the L2 norm of its owned gradients of each replica group
// (replica_group.h; ops::GlobalL2Norm, f32 result of a double sum on the CPU), squares it in
// double, and the squares are summed in double, in rank order: the data group's over its shard
// group (NormGroups::shard.data, the data group when sharded); the expert-data group's over its
// shard group and then over the expert-parallel group (NormGroups::expert: the ranks holding the
// other experts); their sum (the data group's alone when the set has no expert-data parameters)
// over the model group (the pipeline stages, each with its own parameters). So every rank clips by
// the same norm, run to run. Against one rank holding everything, only the order of that sum
// differs (partial sums per group, shard and stage, each rounded to f32 once): the norm agrees to
// f32 rounding.
#pragma once

#include "engine/autograd/parameters.h"
#include "engine/distributed/replica_communicators.h"
#include "engine/kernels/ops.h"

namespace moe {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip_grad = 1.0f;  // max global L2 norm; <= 0 disables clipping
};

// The groups the gradient norm's squares are summed over (above); nullptr: a group of one rank.
struct NormGroups {
  Communicator* model = nullptr;  // the pipeline stages
  // By replica group: the ranks its buckets' state is sharded over (parameters.shards(group)).
  ReplicaCommunicators shard = {};
  Communicator* expert = nullptr;  // the expert-parallel group
};

struct StepReport {
  float grad_norm = 0;  // before clipping
};

class AdamW {
 public:
  explicit AdamW(const AdamWOptions& options) : options_(options) {}

  // One step at learning rate `lr`. Reads the gradient norm back to the host (one sync; two with
  // expert-data parameters). `groups`: the norm's (NormGroups; {}: this rank holds everything).
  StepReport Step(ParameterSet& parameters, float lr, const NormGroups& groups = {});

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

 private:
  AdamWOptions options_;
  int64_t step_ = 0;  // completed steps
};

// The ops::AdamWUpdate entries of a rank's owned slices: model = the slice's value, unless the
// value is the master itself (the CPU).
std::vector<ops::AdamWTensors> AdamWUpdateEntries(const std::vector<OwnedSlice>& slices);

// Linear warmup from 0 to `lr` over `warmup_steps`, then cosine decay to `min_lr` at
// `total_steps`; constant `min_lr` after. `step` counts from 0.
float LearningRate(int64_t step, float lr, float min_lr, int64_t warmup_steps, int64_t total_steps);

}  // namespace moe
