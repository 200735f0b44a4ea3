// CPU AdamW step, per entry (master (n) f32; grad, m, v (n) f32 or bf16; in place):
//   g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   master -= lr * (wd * master + m_hat / (sqrt(v_hat) + eps)) with m_hat = m / (1 - b1^step),
//   v_hat = v / (1 - b2^step); wd = config.weight_decay where the entry decays, else 0.
// Arithmetic in f32: bf16 grad and moments are read widened, the update uses this step's f32
// moments, and they are stored rounded to nearest even (as the CUDA kernel does). model (f32 or
// bf16), when defined, receives the new master values.
#include <cmath>

#include "engine/core/bfloat16.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

template <typename GT, typename MT, typename VT>
void Update(const AdamWTensors& e, const AdamWConfig& config, float m_correction,
            float v_correction) {
  const float weight_decay = e.weight_decay ? config.weight_decay : 0.0f;
  float* w = e.master.data<float>();
  const GT* g = e.grad.data<GT>();
  MT* pm = e.m.data<MT>();
  VT* pv = e.v.data<VT>();
  for (int64_t i = 0, n = e.master.numel(); i < n; ++i) {
    const float gi = config.grad_scale * ToFloat(g[i]);
    const float m = config.beta1 * ToFloat(pm[i]) + (1.0f - config.beta1) * gi;
    const float v = config.beta2 * ToFloat(pv[i]) + (1.0f - config.beta2) * gi * gi;
    pm[i] = FromFloat<MT>(m);
    pv[i] = FromFloat<VT>(v);
    const float update = m * m_correction / (std::sqrt(v * v_correction) + config.eps);
    w[i] -= config.lr * (weight_decay * w[i] + update);
  }
}

}  // namespace

void AdamWUpdate(std::span<const AdamWTensors> entries, const AdamWConfig& config) {
  const auto step = static_cast<double>(config.step);
  const float m_correction = static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, step)));
  const float v_correction = static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, step)));
  for (const AdamWTensors& e : entries) {
    DispatchStorage(e.grad.dtype(), [&]<typename GT>(StorageTag<GT>) {
      DispatchStorage(e.m.dtype(), [&]<typename MT>(StorageTag<MT>) {
        DispatchStorage(e.v.dtype(), [&]<typename VT>(StorageTag<VT>) {
          Update<GT, MT, VT>(e, config, m_correction, v_correction);
        });
      });
    });
    if (e.model.defined()) Cast(e.master, e.model);
  }
}

}  // namespace moe::cpu
