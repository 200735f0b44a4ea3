// CPU AdamW step, per entry (all (n) f32, in place): g = grad_scale * grad; m = b1 m + (1-b1) g;
//   v = b2 v + (1-b2) g^2; master -= lr * (wd * master + m_hat / (sqrt(v_hat) + eps)) with
//   m_hat = m / (1 - b1^step), v_hat = v / (1 - b2^step); wd = config.weight_decay where the
//   entry decays, else 0. model (f32 or bf16), when defined, receives the new master values.
#include <cmath>

#include "engine/core/bfloat16.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

void AdamWUpdate(std::span<const AdamWTensors> entries, const AdamWConfig& config) {
  const auto step = static_cast<double>(config.step);
  const float m_correction = static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, step)));
  const float v_correction = static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, step)));
  for (const AdamWTensors& e : entries) {
    const float weight_decay = e.weight_decay ? config.weight_decay : 0.0f;
    float* w = e.master.data<float>();
    const float* g = e.grad.data<float>();
    float* pm = e.m.data<float>();
    float* pv = e.v.data<float>();
    for (int64_t i = 0, n = e.master.numel(); i < n; ++i) {
      const float gi = config.grad_scale * g[i];
      pm[i] = config.beta1 * pm[i] + (1.0f - config.beta1) * gi;
      pv[i] = config.beta2 * pv[i] + (1.0f - config.beta2) * gi * gi;
      const float update = pm[i] * m_correction / (std::sqrt(pv[i] * v_correction) + config.eps);
      w[i] -= config.lr * (weight_decay * w[i] + update);
    }
    if (e.model.defined()) Cast(e.master, e.model);
  }
}

}  // namespace moe::cpu
