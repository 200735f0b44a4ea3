#include "modules/lm_head_loss.h"

#include <glog/logging.h>

#include <algorithm>

#include "engine/kernels/ops.h"
#include "modules/linear.h"

namespace moe {

int64_t HeadChunkRows(const GptConfig& config, int64_t logit_bytes) {
  if (config.head_chunk_rows > 0) return config.head_chunk_rows;
  return std::max<int64_t>(1, kLogitsChunkBytes / (config.vocab_size * logit_bytes));
}

LmHeadLoss::LmHeadLoss(ParameterSet& parameters, const GptConfig& config)
    : config_(config),
      weight_(parameters.Create({"lm_head.weight",
                                 {config.vocab_size, config.hidden_size},
                                 Init::kNormal,
                                 config.init_std})) {}

Tensor LmHeadLoss::Forward(SavedTensors& saved, const Tensor& x, const Tensor& targets,
                           float loss_grad) {
  const bool training = saved.training();
  CHECK(!training || loss_grad > 0) << "a training forward needs the loss gradient's scale";
  const int64_t tokens = x.dim(0);
  const Device device = x.device();
  const int64_t rows =
      std::min(tokens, HeadChunkRows(config_, static_cast<int64_t>(DTypeSize(x.dtype()))));
  Tensor losses = Tensor::Empty({tokens}, DType::kF32, device);
  Tensor lse = Tensor::Empty({tokens}, DType::kF32, device);
  Tensor dx = training ? Tensor::Empty(x.shape(), x.dtype(), device) : Tensor();
  const Tensor logits_buffer = Tensor::Empty({rows, config_.vocab_size}, x.dtype(), device);
  for (int64_t begin = 0; begin < tokens; begin += rows) {
    const int64_t end = std::min(tokens, begin + rows);
    const Tensor logits = logits_buffer.Rows(0, end - begin);
    const Tensor x_rows = x.Rows(begin, end), target_rows = targets.Rows(begin, end);
    const Tensor lse_rows = lse.Rows(begin, end);
    LinearForwardInto(x_rows, weight_.value, logits);
    if (!training) {
      ops::CrossEntropyForward(logits, target_rows, losses.Rows(begin, end), lse_rows);
      continue;
    }
    ops::CrossEntropyForwardBackward(logits, target_rows, loss_grad, losses.Rows(begin, end),
                                     lse_rows, /*dlogits=*/logits);
    LinearBackward(/*dy=*/logits, x_rows, weight_, dx.Rows(begin, end), /*accumulate_dx=*/false);
  }
  Tensor loss_sum = Tensor::Empty({1}, DType::kF32, device);
  ops::Sum(losses, loss_sum);
  saved.Save("lm_head.dx", dx);
  return loss_sum;
}

Tensor LmHeadLoss::Backward(SavedTensors& saved) { return saved.Load("lm_head.dx"); }

}  // namespace moe
