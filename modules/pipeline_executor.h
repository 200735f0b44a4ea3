// Runs one pipeline rank's action list (engine/pipeline/schedule.h) for one step over the rank's
// model chunks: the whole model when there is one stage, else chunk c is stage c * p + rank.
//
// - Forward(m, c) takes its input from the embedding (the first stage reads the microbatch's
//   ids) or from the activation received for (m, c); the last stage reads the targets and adds
//   its loss. Every forward adds its chunk's aux loss.
// - Backward(m, c) takes its upstream gradient from the loss (last stage) or from the gradient
//   received for (m, c), and keeps its input gradient for SendGrad(m, c).
// - A maximal run of adjacent communication actions is one batch: GroupStart, a Send or Recv per
//   action in list order, GroupEnd, all ordered after the compute before it and waited for by the
//   compute after it (EnqueueBetween). Received tensors are (tokens, hidden) of the compute dtype.
// - Training: one SavedTensors per (microbatch, chunk), all created before the first action and
//   destroyed after their backward; with an offload manager they carry it as hooks, and its
//   backward order is the list's (BackwardOrder). Forward-only (evaluation): nothing is saved.
// - Step timeline (engine/runtime/step_timeline.h), when the device has one: each forward or
//   backward is phase kForward / kBackward, from a communication batch up to the next compute
//   kPipelineWait, the rest kOther; a traced step gets a compute span per action ("Forward(m0,c0)")
//   and a pipeline comm span per batch.
// Gradients accumulate (+=) into the chunks' parameters.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/offload/offload_manager.h"
#include "engine/pipeline/schedule.h"
#include "modules/gpt_model.h"

namespace moe {

struct Microbatch {
  Tensor ids;      // (tokens) i32
  Tensor targets;  // (tokens) i32
};

struct PipelineStepOptions {
  Device device;  // the chunks' device
  bool training = true;
  float loss_grad = 0;                // GptModel::Forward's scale (training only)
  float aux_grad = 0;                 // GptModel::Backward's (training only)
  OffloadManager* offload = nullptr;  // training only; nullptr: no offloading
  GradsFinal grads_final;        // training only: passed to each chunk's last backward of the step
  WeightsNeeded weights_needed;  // passed to every forward
  Shape activation_shape;        // (tokens, hidden) of the tensors crossing stages
  DType activation_dtype = DType::kF32;
};

struct PipelineStepTotals {
  Tensor loss_sum;  // (1) f32: loss summed over the microbatches (0 unless this rank is last)
  Tensor aux_loss;  // (1) f32: aux losses of this rank's chunks summed over the microbatches
  // Compute-stream time: the sum over forward and backward actions of each one's span (from
  // after its inputs have arrived to its end), and the span from the first action's start to
  // the last one's end. 1 - busy / span is this rank's pipeline bubble.
  double busy_ms = 0;
  double span_ms = 0;
};

// `pipeline` is the pipeline group (nullptr: one stage, and `actions` has no communication).
// `microbatch(m)` gives microbatch m's data; called for the first and the last stage's forwards.
PipelineStepTotals RunPipelineStep(const RankActions& actions,
                                   const std::vector<std::unique_ptr<GptModel>>& chunks,
                                   Communicator* pipeline,
                                   const std::function<Microbatch(int)>& microbatch,
                                   const PipelineStepOptions& options);

}  // namespace moe
