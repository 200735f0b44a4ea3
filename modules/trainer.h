// Trainer: the training loop of one GptModel on one device.
//
// A step draws global_batch_size / micro_batch_size micro-batches from the sampler, runs forward
// and backward on each (gradients accumulate in f32), then clips the global gradient norm and
// takes one AdamW step at the scheduled learning rate. The loss is the mean cross-entropy over
// every target of the global batch; each MoE layer's coefficient-weighted aux loss is averaged
// over the micro-batches. Evaluation runs forward-only passes (nothing saved) over a fixed set of
// validation batches.
//
// With TrainerOptions::offload set, the trainer owns an OffloadManager and passes it to each
// micro-batch's saved-tensor context (evaluation passes none); StepStats::offload reports what a
// step moved, and the manager's policy table exists after the first step.
//
// Checkpoints hold the f32 master weights (model.safetensors, by parameter name), the AdamW
// moments (optimizer.safetensors, "<name>.exp_avg" / "<name>.exp_avg_sq") and state.json (step,
// data position, seed, model shape, and whatever run description the caller adds). Everything
// the loop does is a function of that state, so a resumed run repeats an uninterrupted one bit
// for bit.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/io/dataset.h"
#include "engine/offload/offload_manager.h"
#include "engine/optim/adamw.h"
#include "engine/optim/parameters.h"
#include "modules/gpt_config.h"
#include "modules/gpt_model.h"

namespace moe {

struct TrainerOptions {
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 8;
  int64_t train_steps = 100;
  float lr = 3e-3f;
  float min_lr = 3e-4f;
  int64_t warmup_steps = 10;
  AdamWOptions adamw;
  int64_t eval_steps = 4;  // validation batches (of micro_batch_size) per evaluation
  uint64_t seed = 1234;
  std::optional<OffloadOptions> offload;  // fine-grained activation offloading (off if unset)
};

struct StepStats {
  double loss = 0;      // mean cross-entropy over the global batch
  double aux_loss = 0;  // summed over MoE layers, averaged over micro-batches
  float lr = 0;
  float grad_norm = 0;
  int64_t tokens = 0;
  double seconds = 0;   // wall time of the step, device work included
  OffloadStepStats offload;  // zero without offloading
};

class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Create(const GptConfig& config,
                                                   const TrainerOptions& options, Device device,
                                                   const TokenSource* source);

  StepStats TrainStep();
  // Mean validation cross-entropy over options.eval_steps batches.
  double Evaluate();

  int64_t step() const { return step_; }
  const ParameterSet& parameters() const { return parameters_; }
  const GptModel& model() const { return model_; }
  // nullptr unless TrainerOptions::offload is set.
  const OffloadManager* offload_manager() const { return offload_.get(); }

  // Writes root/step_<step>; `description` is stored in state.json under "run".
  Status Save(const std::string& root, const nlohmann::json& description);
  // Restores weights, optimizer state, step and data position. The checkpoint's model shape
  // must equal this trainer's.
  Status Load(const std::string& path);

  // For reference checks against another implementation: one forward and backward of the
  // first training micro-batch, written to dir/reference.safetensors (the f32 master weights
  // under their names, "grad.<name>" for each gradient of loss = mean cross-entropy + aux
  // losses, "ids", "targets", "loss", "aux_loss") and dir/config.json (the model shape and
  // hyper-parameters). Changes no trainer state.
  Status DumpReferenceCase(const std::string& dir);

 private:
  Trainer(const GptConfig& config, const TrainerOptions& options, Device device,
          BatchSampler sampler);
  // Copies a (rows, seq + 1) window batch to the device as ids and targets (rows * seq).
  void Upload(const std::vector<int32_t>& windows, int64_t rows, Tensor* ids, Tensor* targets) const;
  nlohmann::json ModelShape() const;
  nlohmann::json ModelConfig() const;  // the shape plus every numeric hyper-parameter

  GptConfig config_;
  TrainerOptions options_;
  Device device_;
  ParameterSet parameters_;
  GptModel model_;
  AdamW optimizer_;
  BatchSampler sampler_;
  std::unique_ptr<OffloadManager> offload_;
  int64_t step_ = 0;
};

}  // namespace moe
