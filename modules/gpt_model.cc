#include "modules/gpt_model.h"

#include <glog/logging.h>

#include "engine/kernels/ops.h"
#include "engine/runtime/step_timeline.h"

namespace moe {

GptModel::GptModel(const GptConfig& config, ParameterSet& parameters)
    : GptModel(config, parameters, GptStage{0, config.num_layers, true, true}) {}

GptModel::GptModel(const GptConfig& config, ParameterSet& parameters, const GptStage& stage,
                   ExpertParallel* expert_parallel)
    : config_(config), stage_(stage) {
  CHECK(0 <= stage.layer_begin && stage.layer_begin <= stage.layer_end &&
        stage.layer_end <= config.num_layers)
      << "stage layers [" << stage.layer_begin << ", " << stage.layer_end << ") of "
      << config.num_layers;
  if (stage.first) {
    embedding_ = &parameters.Create({"embedding.weight",
                                     {config.vocab_size, config.hidden_size},
                                     Init::kNormal,
                                     config.init_std});
  }
  for (int64_t layer = stage.layer_begin; layer < stage.layer_end; ++layer) {
    layers_.push_back(std::make_unique<TransformerLayer>(parameters, config_, layer, rotary_table_,
                                                         expert_parallel));
  }
  if (stage.last) {
    final_norm_ = std::make_unique<RmsNorm>(parameters, "final_norm", config.hidden_size,
                                            config.norm_epsilon);
    head_ = std::make_unique<LmHeadLoss>(parameters, config_);
  }
}

void GptModel::SetRecomputeByLayer(std::vector<RecomputeModules> by_layer) {
  CHECK_EQ(static_cast<int64_t>(by_layer.size()), config_.num_layers);
  config_.recompute_by_layer = std::move(by_layer);
}

std::vector<ParameterSpec> GptModel::StageParameterSpecs(const GptConfig& config,
                                                         const GptStage& stage) {
  ParameterSet specs = ParameterSet::SpecsOnly();
  const GptModel model(config, specs, stage);
  return specs.specs();
}

ForwardResult GptModel::Forward(SavedTensors& saved, const Tensor& input, const Tensor& targets,
                                float loss_grad, const WeightsNeeded& weights_needed) {
  const auto needed = [&](const std::string& prefix) {
    if (weights_needed) weights_needed(prefix);
  };
  const int64_t tokens = input.dim(0);
  const Device device = input.device();
  ForwardResult result;
  result.aux_loss = Tensor::Empty({1}, DType::kF32, device);
  ops::Fill(result.aux_loss, 0.0f);

  Tensor x = input;
  if (stage_.first) {
    const TraceSpan span(device, "embedding forward");
    needed("embedding.");
    x = Tensor::Empty({tokens, config_.hidden_size}, embedding_->value.dtype(), device);
    ops::EmbeddingForward(input, embedding_->value, x);
    saved.Save("ids", input);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    needed(LayerName(static_cast<int>(stage_.layer_begin + i)) + ".");
    x = layers_[i]->Forward(saved, x, result.aux_loss);
  }
  if (!stage_.last) {
    result.output = x;
    return result;
  }
  const TraceSpan span(device, "head and loss forward");
  needed("final_norm.");
  needed("lm_head.");
  result.loss_sum = head_->Forward(saved, final_norm_->Forward(saved, x), targets, loss_grad);
  return result;
}

Tensor GptModel::Backward(SavedTensors& saved, const Tensor& output_grad, float aux_grad,
                          bool last_of_step, const GradsFinal& grads_final) {
  CHECK(last_of_step || !grads_final)
      << "gradients announced final before the step's last backward";
  const auto grads_done = [&](const std::string& prefix) {
    if (grads_final) grads_final(prefix);
  };
  Tensor dx = output_grad;
  if (stage_.last) {
    dx = head_->Backward(saved);  // computed by the forward
    const TraceSpan span(dx.device(), "head and loss backward");
    grads_done("lm_head.");
    dx = final_norm_->Backward(saved, dx);
    grads_done("final_norm.");
  }
  for (int64_t i = static_cast<int64_t>(layers_.size()) - 1; i >= 0; --i) {
    dx = layers_[i]->Backward(saved, dx, aux_grad, last_of_step);
    grads_done(LayerName(static_cast<int>(stage_.layer_begin + i)) + ".");
  }
  if (!stage_.first) return dx;
  const TraceSpan span(dx.device(), "embedding backward");
  ops::EmbeddingBackward(saved.Load("ids"), dx, MaterializedGrad(*embedding_));
  grads_done("embedding.");
  return Tensor();
}

}  // namespace moe
