#include "modules/gpt_model.h"

#include "engine/kernels/ops.h"
#include "modules/linear.h"

namespace moe {

GptModel::GptModel(const GptConfig& config, ParameterSet& parameters)
    : config_(config),
      embedding_(parameters.Create({"embedding.weight", {config.vocab_size, config.hidden_size},
                                    Init::kNormal, config.init_std})),
      final_norm_(parameters, "final_norm", config.hidden_size, config.norm_eps),
      lm_head_(parameters.Create({"lm_head.weight", {config.vocab_size, config.hidden_size},
                                  Init::kNormal, config.init_std})) {
  for (int layer = 0; layer < config.num_layers; ++layer) {
    layers_.push_back(std::make_unique<TransformerLayer>(parameters, config_, layer));
  }
}

ForwardResult GptModel::Forward(SavedTensors& saved, const Tensor& ids, const Tensor& targets) {
  const int64_t tokens = ids.dim(0);
  const Device device = ids.device();
  const DType dtype = embedding_.value.dtype();
  ForwardResult result;
  result.aux_loss = Tensor::Empty({1}, DType::kF32, device);
  ops::Fill(result.aux_loss, 0.0f);

  Tensor x = Tensor::Empty({tokens, config_.hidden_size}, dtype, device);
  ops::EmbeddingForward(ids, embedding_.value, x);
  for (auto& layer : layers_) x = layer->Forward(saved, x, result.aux_loss);
  const Tensor normed = final_norm_.Forward(saved, x);
  const Tensor logits = LinearForward(normed, lm_head_);

  Tensor losses = Tensor::Empty({tokens}, DType::kF32, device);
  Tensor lse = Tensor::Empty({tokens}, DType::kF32, device);
  ops::CrossEntropyForward(logits, targets, losses, lse);
  result.loss_sum = Tensor::Empty({1}, DType::kF32, device);
  ops::Sum(losses, result.loss_sum);

  saved.Save("ids", ids);
  saved.Save("targets", targets);
  saved.Save("lm_head.x", normed);
  saved.Save("logits", logits);
  saved.Save("lse", lse);
  return result;
}

void GptModel::Backward(SavedTensors& saved, float loss_grad, float aux_grad) {
  const Tensor logits = saved.Load("logits");
  Tensor dlogits = Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
  ops::CrossEntropyBackward(logits, saved.Load("targets"), saved.Load("lse"), loss_grad, dlogits);
  Tensor dx = LinearBackward(dlogits, saved.Load("lm_head.x"), lm_head_);
  dx = final_norm_.Backward(saved, dx);
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) dx = (*it)->Backward(saved, dx, aux_grad);
  ops::EmbeddingBackward(saved.Load("ids"), dx, embedding_.grad);
}

}  // namespace moe
