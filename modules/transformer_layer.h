// Pre-norm transformer layer:
//   h = x + attention(attn_norm(x));  y = h + mlp(mlp_norm(h)),  mlp dense or MoE.
// x, y (tokens, hidden). The first residual add runs in mlp_norm's kernel (RmsNorm::Forward with
// a residual: h is written and normalised in one pass). The norms' offload groups (attn_norm,
// mlp_norm) hold the norm's saved tensors and commit after their residual add.
// With config.recompute_in(layer).layernorm, the norms' outputs are not kept by the modules that
// saved them (the attention's and the MLP's inputs): forward drops them (SavedTensors::Drop) and
// backward recomputes each from its norm's saved input just before the module's backward reads it.
// Backward: dx =; every weight grad += (the experts' may wait for a later backward unless
// last_of_step: grouped_mlp.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/saved_tensors.h"
#include "modules/attention.h"
#include "modules/dense_mlp.h"
#include "modules/moe_layer.h"
#include "modules/rms_norm.h"

namespace moe {

// "layers.N": the prefix of layer N's parameter names ("layers.N.attention.q_proj.weight", ...).
std::string LayerName(int layer);

class TransformerLayer {
 public:
  // rotary_table: the model's, shared by its layers' attention. expert_parallel: the MoE
  // layer's (moe_layer.h), nullptr without expert parallelism.
  TransformerLayer(ParameterSet& parameters, const GptConfig& config, int layer,
                   RotaryTable& rotary_table, ExpertParallel* expert_parallel = nullptr);
  // aux_loss (1) f32 accumulates the MoE aux loss.
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss);
  Tensor Backward(SavedTensors& saved, const Tensor& dy, float aux_grad, bool last_of_step = true);

 private:
  void DropNormOutput(SavedTensors& saved, const Tensor& output,
                      std::vector<std::string>& keys) const;
  void RecomputeNormOutput(SavedTensors& saved, const RmsNorm& norm,
                           const std::vector<std::string>& keys) const;

  const GptConfig& config_;  // the model's: what the layer recomputes may change between steps
  int layer_;
  RmsNorm attn_norm_;
  SelfAttention attention_;
  RmsNorm mlp_norm_;
  std::unique_ptr<DenseMlp> dense_mlp_;  // exactly one of these two
  std::unique_ptr<MoeLayer> moe_mlp_;
  // The keys that held each norm's output, dropped under layernorm recompute (the same for every
  // micro-batch: module-scoped names).
  std::vector<std::string> attn_norm_output_keys_;
  std::vector<std::string> mlp_norm_output_keys_;
};

}  // namespace moe
