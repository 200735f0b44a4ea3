// The untied LM head and the per-token cross-entropy, over chunks of token rows: the whole
// (tokens, vocab) logits never exist, only one (rows, vocab) chunk of them at a time.
//   x (tokens, hidden): the final norm's output; weight "lm_head.weight" (vocab, hidden);
//   targets (tokens) i32, a negative target is ignored (loss 0, gradient 0).
//   Forward returns loss_sum (1) f32: the sum of lse - logit[target] over non-ignored tokens.
// Per chunk of rows: logits = x_c W^T into one reused buffer; the cross-entropy (losses and lse
// into their rows of (tokens) f32 tensors); in a training forward (saved.training()) also the
// head's backward, with d(loss_sum) scaled by loss_grad: dlogits in place of the logits (by the
// call that writes the losses, CrossEntropyForwardBackward), dx_c = dlogits W (=) into its rows
// of dx (tokens, hidden), and W.grad (f32) = or += dlogits^T x_c (BeginGradWrite: the step's
// first write stores). So a training forward leaves the head's weight gradient written and its
// forward time includes the head's backward.
// Saves (training only, no group): dx under "lm_head.dx". Backward returns it (nothing else is
// computed or read). A forward-only pass computes the loss in the same chunks, saves nothing and
// touches no gradient.
// One chunk of every token runs the ops of a single whole-logits pass, op for op; smaller chunks
// change the loss and gradients by fp32 rounding only (GEMMs over fewer rows, the weight gradient
// summed chunk by chunk).
#pragma once

#include <cstdint>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"

namespace moe {

// The bytes of one chunk of logits. The weight-gradient GEMM of a chunk reads and writes the f32
// (vocab, hidden) gradient once: 2 x vocab x hidden x rows FLOPs over 8 x vocab x hidden bytes, so
// rows / 4 FLOP per byte, which must stay above the GPU's ratio of matmul rate to memory bandwidth
// (about 165 on the GPUs this targets: tests/results/memory_and_offload.md) to be compute-bound:
// rows >= ~660. 512 MiB is 8388 rows of the 8-layer preset's bf16 logits (vocab
// 32000) and 1766 of Qwen3's (151936), small against the whole logits of a large micro-batch
// (4.2 GB at 16 x 4096 tokens of vocab 32000).
inline constexpr int64_t kLogitsChunkBytes = int64_t{512} << 20;

// Token rows per chunk: config.head_chunk_rows when set (> 0), else as many rows of vocab_size
// logits of `logit_bytes` bytes each as fit in kLogitsChunkBytes, at least 1.
int64_t HeadChunkRows(const GptConfig& config, int64_t logit_bytes);

class LmHeadLoss {
 public:
  LmHeadLoss(ParameterSet& parameters, const GptConfig& config);
  // loss_grad scales d(loss_sum) (1 / tokens in the global batch); read in training only.
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& targets, float loss_grad);
  Tensor Backward(SavedTensors& saved);  // dx (tokens, hidden)

 private:
  const GptConfig& config_;
  Parameter& weight_;
};

}  // namespace moe
