// CPU causal attention with grouped KV heads: the plain reference, f32 data, double sums.
//   q, out (batch, seq, heads, d); k, v (batch, seq, kv_heads, d); head h reads kv head
//   h / (heads / kv_heads). s_ij = q_i . k_j / sqrt(d) for j <= i; lse_i = log sum_j exp(s_ij)
//   (batch, heads, seq) saved; p_ij = exp(s_ij - lse_i); out_i = sum_j p_ij v_j.
// Backward recomputes p from lse: dv_j = sum_i p_ij do_i; ds_ij = p_ij (do_i . v_j - do_i . out_i);
// dq_i = scale sum_j ds_ij k_j; dk_j = scale sum_i ds_ij q_i. All three are written (=); dk and dv
// sum over the query heads of a group.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// Index arithmetic for one (batch, query head) pair.
struct HeadView {
  HeadView(const Tensor& q, const Tensor& k, int64_t b, int64_t h)
      : seq(q.dim(1)),
        heads(q.dim(2)),
        kv_heads(k.dim(2)),
        d(q.dim(3)),
        q_offset((b * seq * heads + h) * d),
        kv_offset((b * seq * kv_heads + h / (heads / kv_heads)) * d),
        lse_offset((b * heads + h) * seq),
        scale(1.0 / std::sqrt(static_cast<double>(d))) {}

  // Element offsets of token i's vector for this head.
  int64_t q_at(int64_t i) const { return q_offset + i * heads * d; }
  int64_t kv_at(int64_t j) const { return kv_offset + j * kv_heads * d; }

  double Dot(const float* a, const float* b) const {
    double sum = 0;
    for (int64_t c = 0; c < d; ++c) sum += static_cast<double>(a[c]) * b[c];
    return sum;
  }

  int64_t seq, heads, kv_heads, d, q_offset, kv_offset, lse_offset;
  double scale;
};

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse) {
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  float* po = out.data<float>();
  std::vector<double> scores, acc;
  for (int64_t b = 0; b < q.dim(0); ++b) {
    for (int64_t h = 0; h < q.dim(2); ++h) {
      const HeadView hv(q, k, b, h);
      acc.resize(hv.d);
      for (int64_t i = 0; i < hv.seq; ++i) {
        scores.assign(i + 1, 0.0);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          scores[j] = hv.scale * hv.Dot(pq + hv.q_at(i), pk + hv.kv_at(j));
          max = std::max(max, scores[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[j] - max);
        const double log_sum = max + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(scores[j] - log_sum);
          const float* vj = pv + hv.kv_at(j);
          for (int64_t c = 0; c < hv.d; ++c) acc[c] += p * vj[c];
        }
        float* oi = po + hv.q_at(i);
        for (int64_t c = 0; c < hv.d; ++c) oi[c] = static_cast<float>(acc[c]);
        lse.data<float>()[hv.lse_offset + i] = static_cast<float>(log_sum);
      }
    }
  }
}

void AttentionBackward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                       const Tensor& dv) {
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const float *pdo = dout.data<float>(), *po = out.data<float>();
  // dk and dv gather contributions from several heads: accumulate in double, write once.
  std::vector<double> dk_acc(k.numel(), 0.0), dv_acc(v.numel(), 0.0), dq_acc;
  for (int64_t b = 0; b < q.dim(0); ++b) {
    for (int64_t h = 0; h < q.dim(2); ++h) {
      const HeadView hv(q, k, b, h);
      dq_acc.resize(hv.d);
      for (int64_t i = 0; i < hv.seq; ++i) {
        const float* qi = pq + hv.q_at(i);
        const float* doi = pdo + hv.q_at(i);
        const double log_sum = lse.data<float>()[hv.lse_offset + i];
        const double delta = hv.Dot(doi, po + hv.q_at(i));
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = pk + hv.kv_at(j);
          const double p = std::exp(hv.scale * hv.Dot(qi, kj) - log_sum);
          const double ds = p * (hv.Dot(doi, pv + hv.kv_at(j)) - delta) * hv.scale;
          double* dkj = &dk_acc[hv.kv_at(j)];
          double* dvj = &dv_acc[hv.kv_at(j)];
          for (int64_t c = 0; c < hv.d; ++c) {
            dq_acc[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
            dvj[c] += p * doi[c];
          }
        }
        float* dqi = dq.data<float>() + hv.q_at(i);
        for (int64_t c = 0; c < hv.d; ++c) dqi[c] = static_cast<float>(dq_acc[c]);
      }
    }
  }
  std::copy(dk_acc.begin(), dk_acc.end(), dk.data<float>());
  std::copy(dv_acc.begin(), dv_acc.end(), dv.data<float>());
}

}  // namespace moe::cpu
