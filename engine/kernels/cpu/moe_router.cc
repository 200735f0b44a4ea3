// CPU MoE router ops: row renormalisation of the top-k probabilities, the load-balancing and z
// losses (forward and backward), and the inverse of the token permutation. Accumulations in
// double, in a fixed order.
#include <cmath>

#include <glog/logging.h>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

void NormalizeRowsForward(const Tensor& x, const Tensor& y) {
  const int64_t rows = x.dim(0), k = x.dim(1);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += px[r * k + j];
    for (int64_t j = 0; j < k; ++j) py[r * k + j] = static_cast<float>(px[r * k + j] / sum);
  }
}

void NormalizeRowsBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const int64_t rows = x.dim(0), k = x.dim(1);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) sum += px[r * k + j];
    for (int64_t j = 0; j < k; ++j) dot += pdy[r * k + j] * (px[r * k + j] / sum);
    for (int64_t j = 0; j < k; ++j)
      pdx[r * k + j] = static_cast<float>((pdy[r * k + j] - dot) / sum);
  }
}

void LoadBalancingLossForward(const Tensor& probs, const Tensor& offsets, int64_t topk,
                              const Tensor& loss) {
  const int64_t tokens = probs.dim(0), experts = probs.dim(1);
  const int32_t* offset = offsets.data<int32_t>();
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) {
    double column = 0;
    for (int64_t t = 0; t < tokens; ++t) column += probs.data<float>()[t * experts + e];
    total += static_cast<double>(offset[e + 1] - offset[e]) * column;
  }
  loss.data<float>()[0] =
      static_cast<float>(total * experts / (static_cast<double>(tokens) * tokens * topk));
}

void LoadBalancingLossBackward(const Tensor& offsets, int64_t topk, float grad,
                               const Tensor& dprobs) {
  const int64_t tokens = dprobs.dim(0), experts = dprobs.dim(1);
  const int32_t* offset = offsets.data<int32_t>();
  for (int64_t e = 0; e < experts; ++e) {
    const double g = static_cast<double>(grad) * experts * (offset[e + 1] - offset[e]) /
                     (static_cast<double>(tokens) * tokens * topk);
    for (int64_t t = 0; t < tokens; ++t)
      dprobs.data<float>()[t * experts + e] += static_cast<float>(g);
  }
}

namespace {
double RowLogSumExp(const float* row, int64_t n) {
  double max = row[0];
  for (int64_t j = 1; j < n; ++j) max = std::max<double>(max, row[j]);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - max);
  return max + std::log(sum);
}
}  // namespace

void ZLossForward(const Tensor& logits, const Tensor& loss) {
  const int64_t tokens = logits.dim(0), experts = logits.dim(1);
  double total = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double lse = RowLogSumExp(logits.data<float>() + t * experts, experts);
    total += lse * lse;
  }
  loss.data<float>()[0] = static_cast<float>(total / tokens);
}

void ZLossBackward(const Tensor& logits, float grad, const Tensor& dlogits) {
  const int64_t tokens = logits.dim(0), experts = logits.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits.data<float>() + t * experts;
    const double lse = RowLogSumExp(row, experts);
    for (int64_t e = 0; e < experts; ++e) {
      dlogits.data<float>()[t * experts + e] +=
          static_cast<float>(grad * 2.0 * lse * std::exp(row[e] - lse) / tokens);
    }
  }
}

void InvertPermutation(const Tensor& order, int64_t topk, const Tensor& source_rows,
                       const Tensor& inverse) {
  const int64_t n = order.numel();
  const int32_t* o = order.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    CHECK(o[i] >= 0 && o[i] < n) << "permutation entry " << o[i] << " outside [0, " << n << ")";
    source_rows.data<int32_t>()[i] = static_cast<int32_t>(o[i] / topk);
    inverse.data<int32_t>()[o[i]] = static_cast<int32_t>(i);
  }
}

}  // namespace moe::cpu
