// CPU per-token cross-entropy, f32 (double row sums).
//   CrossEntropyForward: lse (tokens) = log sum exp(logits row); losses = lse - logit[target]
//     (=), 0 where target < 0 (lse is still written).
//   CrossEntropyBackward: dlogits = grad_scale * (exp(logit - lse) - onehot(target)) (=); rows
//     with a negative target are 0. Targets at or above the vocabulary are CHECK failures.
//   CrossEntropyForwardBackward: the two, one after the other.
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/checked_index.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

void CrossEntropyForward(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                         const Tensor& lse) {
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits.data<float>() + t * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - max);
    const double log_sum = max + std::log(sum);
    lse.data<float>()[t] = static_cast<float>(log_sum);
    const bool ignored = targets.data<int32_t>()[t] < 0;
    losses.data<float>()[t] =
        ignored ? 0.0f
                : static_cast<float>(
                      log_sum - row[CheckedIndex(targets.data<int32_t>(), t, vocab, "target")]);
  }
}

void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                          float grad_scale, const Tensor& dlogits) {
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits.data<float>() + t * vocab;
    float* drow = dlogits.data<float>() + t * vocab;
    if (targets.data<int32_t>()[t] < 0) {
      std::fill(drow, drow + vocab, 0.0f);
      continue;
    }
    const int32_t target = CheckedIndex(targets.data<int32_t>(), t, vocab, "target");
    const float log_sum = lse.data<float>()[t];
    for (int64_t j = 0; j < vocab; ++j) {
      drow[j] = grad_scale * (std::exp(row[j] - log_sum) - (j == target ? 1.0f : 0.0f));
    }
  }
}

void CrossEntropyForwardBackward(const Tensor& logits, const Tensor& targets, float grad_scale,
                                 const Tensor& losses, const Tensor& lse, const Tensor& dlogits) {
  CrossEntropyForward(logits, targets, losses, lse);
  CrossEntropyBackward(logits, targets, lse, grad_scale, dlogits);
}

}  // namespace moe::cpu
