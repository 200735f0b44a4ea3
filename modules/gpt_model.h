// The GPT model: token embedding -> transformer layers -> final RMSNorm -> untied LM head ->
// per-token cross-entropy in fp32, the last two in chunks of tokens (modules/lm_head_loss.h).
//   ids, targets (tokens = batch * seq) i32 on the model's device; a negative target is ignored.
// Parameter names follow "embedding.weight", "layers.N.attention.q_proj.weight", ...,
// "final_norm.weight", "lm_head.weight" (the safetensors checkpoint uses the same names).
//
// A pipeline stage (GptStage) is a slice of the model: the embedding if it is the first stage,
// its layer range, the final norm, head and loss if it is the last. The whole model is the one
// stage that is both. A stage creates only its own parameters, under the whole model's names.
//   Forward input: ids on the first stage, else the previous stage's output (tokens, hidden).
//   Backward output_grad: ignored on the last stage (the loss is its output), else the gradient
//   of this stage's output (tokens, hidden); returns the gradient of its input (tokens, hidden),
//   or an empty tensor on the first stage.
// Saves (no group): ids (first stage); the final norm's input and rstd, and the head's input
// gradient (tokens, hidden) (last stage): a training forward of the last stage runs the head's
// backward too, so lm_head.weight's gradient is written (as BeginGradWrite says) by Forward, and
// the (tokens, vocab) logits are never whole. Backward: every other grad +=.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"
#include "modules/lm_head_loss.h"
#include "modules/rms_norm.h"
#include "modules/transformer_layer.h"

namespace moe {

using GradsFinal = std::function<void(const std::string& name_prefix)>;
using WeightsNeeded = std::function<void(const std::string& name_prefix)>;

struct GptStage {
  int64_t layer_begin = 0;
  int64_t layer_end = 0;  // exclusive
  bool first = true;      // holds the embedding
  bool last = true;       // holds the final norm, the head and the loss
};

struct ForwardResult {
  Tensor output;    // (tokens, hidden): the last layer's output, for the next stage (not last)
  Tensor loss_sum;  // (1) f32, last stage: sum of per-token cross-entropy over non-ignored targets
  Tensor aux_loss;  // (1) f32: sum over this stage's MoE layers of the weighted aux losses
};

class GptModel {
 public:
  // The whole model.
  GptModel(const GptConfig& config, ParameterSet& parameters);
  // expert_parallel: the MoE layers' under expert parallelism (moe_layer.h), else nullptr; the
  // stage then holds its rank's experts only. It must outlive the model.
  GptModel(const GptConfig& config, ParameterSet& parameters, const GptStage& stage,
           ExpertParallel* expert_parallel = nullptr);
  GptModel(const GptModel&) = delete;  // its modules refer to its config
  GptModel& operator=(const GptModel&) = delete;
  // The parameters a stage creates, in creation order, without creating them.
  static std::vector<ParameterSpec> StageParameterSpecs(const GptConfig& config,
                                                        const GptStage& stage);

  // targets and loss_grad are read on the last stage only; loss_grad scales d(loss_sum) (1 /
  // tokens in the global batch) in a training forward (saved.training()), unused otherwise.
  // weights_needed, if set, is called with a parameter-name prefix before the weights under it
  // are first read: "embedding.", each "layers.N." from the first layer up, "final_norm.",
  // "lm_head.".
  ForwardResult Forward(SavedTensors& saved, const Tensor& input, const Tensor& targets,
                        float loss_grad, const WeightsNeeded& weights_needed = {});
  // aux_grad scales the aux losses (1 / micro-batches in the global batch). last_of_step: this is
  // the step's last backward of this stage, after which every gradient is complete; an earlier
  // one may leave the experts' weight gradients to a later one
  // (GptConfig::moe_wgrad_micro_batches). grads_final, if set (on the last), is called with a
  // parameter-name prefix as soon as the gradients under it are complete: "lm_head." (complete
  // since the step's last forward of this stage), "final_norm.", each "layers.N." from the last
  // layer down, "embedding.".
  Tensor Backward(SavedTensors& saved, const Tensor& output_grad, float aux_grad,
                  bool last_of_step = true, const GradsFinal& grads_final = {});

  // What each layer recomputes from the next pass on (GptConfig::recompute_by_layer: one entry per
  // layer of the whole model; the modules read the model's config when they run). Call between
  // steps, with no pass in flight.
  void SetRecomputeByLayer(std::vector<RecomputeModules> by_layer);

  const GptConfig& config() const { return config_; }
  const GptStage& stage() const { return stage_; }

 private:
  GptConfig config_;
  GptStage stage_;
  Parameter* embedding_ = nullptr;     // first stage
  RotaryTable rotary_table_{config_};  // the layers' RoPE table
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<RmsNorm> final_norm_;  // last stage
  std::unique_ptr<LmHeadLoss> head_;     // last stage
};

}  // namespace moe
