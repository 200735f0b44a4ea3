// CPU embedding lookup and per-token cross-entropy, f32 (double row sums).
//   EmbeddingForward: out (tokens, h) = table[ids] (=). EmbeddingBackward: dtable += dout rows
//     scattered by ids, in token order (deterministic).
//   CrossEntropyForward: lse (tokens) = log sum exp(logits row); losses = lse - logit[target]
//     (=), 0 where target < 0 (lse is still written).
//   CrossEntropyBackward: dlogits = grad_scale * (exp(logit - lse) - onehot(target)) (=); rows
//     with a negative target are 0.
#include <algorithm>
#include <cmath>

#include <glog/logging.h>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

int32_t CheckedId(const Tensor& ids, int64_t i, int64_t bound, const char* what) {
  const int32_t id = ids.data<int32_t>()[i];
  CHECK(id >= 0 && id < bound) << what << " " << id << " at " << i << " outside [0, " << bound
                               << ")";
  return id;
}

}  // namespace

void EmbeddingForward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const int64_t vocab = table.dim(0), h = table.dim(1);
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    const float* row = table.data<float>() + CheckedId(ids, t, vocab, "embedding id") * h;
    std::copy(row, row + h, out.data<float>() + t * h);
  }
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const int64_t vocab = dtable.dim(0), h = dtable.dim(1);
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    float* row = dtable.data<float>() + CheckedId(ids, t, vocab, "embedding id") * h;
    const float* g = dout.data<float>() + t * h;
    for (int64_t j = 0; j < h; ++j) row[j] += g[j];
  }
}

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
        ignored ? 0.0f : static_cast<float>(log_sum - row[CheckedId(targets, t, vocab, "target")]);
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
    const int32_t target = CheckedId(targets, t, vocab, "target");
    const float log_sum = lse.data<float>()[t];
    for (int64_t j = 0; j < vocab; ++j) {
      drow[j] = grad_scale * (std::exp(row[j] - log_sum) - (j == target ? 1.0f : 0.0f));
    }
  }
}

}  // namespace moe::cpu
