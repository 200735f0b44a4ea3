// The GPT model: token embedding -> transformer layers -> final RMSNorm -> untied LM head ->
// per-token cross-entropy in fp32.
//   ids, targets (tokens = batch * seq) i32 on the model's device; a negative target is ignored.
// Parameter names follow "embedding.weight", "layers.N.attention.q_proj.weight", ...,
// "final_norm.weight", "lm_head.weight" (the safetensors checkpoint uses the same names).
// Saves (no group): ids, the head's input, logits and their lse. Backward: every grad +=.
#pragma once

#include <memory>
#include <vector>

#include "engine/autograd/saved_tensors.h"
#include "engine/optim/parameters.h"
#include "modules/gpt_config.h"
#include "modules/rms_norm.h"
#include "modules/transformer_layer.h"

namespace moe {

struct ForwardResult {
  Tensor loss_sum;   // (1) f32: sum of per-token cross-entropy over non-ignored targets
  Tensor aux_loss;   // (1) f32: sum over MoE layers of the coefficient-weighted aux losses
};

class GptModel {
 public:
  GptModel(const GptConfig& config, ParameterSet& parameters);

  ForwardResult Forward(SavedTensors& saved, const Tensor& ids, const Tensor& targets);
  // loss_grad scales d(loss_sum) (1 / tokens in the global batch); aux_grad scales the aux
  // losses (1 / micro-batches in the global batch).
  void Backward(SavedTensors& saved, float loss_grad, float aux_grad);

  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
  Parameter& embedding_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  RmsNorm final_norm_;
  Parameter& lm_head_;
};

}  // namespace moe
