// CPU AdamW step, per entry (master, grad (n) f32; m, v (n) f32 or bf16, in place):
//   g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   master -= lr * (wd * master + m_hat / (sqrt(v_hat) + eps)) with m_hat = m / (1 - b1^step),
//   v_hat = v / (1 - b2^step); wd = config.weight_decay where the entry decays, else 0.
// Arithmetic in f32: bf16 moments are read widened, the update uses this step's f32 moments, and
// they are stored rounded to nearest even (as the CUDA kernel does). model (f32 or bf16), when
// defined, receives the new master values.
#include <cmath>

#include "engine/core/bfloat16.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

float Load(const float* p, int64_t i) { return p[i]; }
float Load(const BFloat16* p, int64_t i) { return BFloat16ToFloat(p[i]); }
void Store(float* p, int64_t i, float value) { p[i] = value; }
void Store(BFloat16* p, int64_t i, float value) { p[i] = FloatToBFloat16(value); }

template <typename MT, typename VT>
void Update(const AdamWTensors& e, const AdamWConfig& config, float m_correction,
            float v_correction) {
  const float weight_decay = e.weight_decay ? config.weight_decay : 0.0f;
  float* w = e.master.data<float>();
  const float* g = e.grad.data<float>();
  MT* pm = e.m.data<MT>();
  VT* pv = e.v.data<VT>();
  for (int64_t i = 0, n = e.master.numel(); i < n; ++i) {
    const float gi = config.grad_scale * g[i];
    const float m = config.beta1 * Load(pm, i) + (1.0f - config.beta1) * gi;
    const float v = config.beta2 * Load(pv, i) + (1.0f - config.beta2) * gi * gi;
    Store(pm, i, m);
    Store(pv, i, v);
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
    const bool bf16_m = e.m.dtype() == DType::kBF16, bf16_v = e.v.dtype() == DType::kBF16;
    if (bf16_m && bf16_v) {
      Update<BFloat16, BFloat16>(e, config, m_correction, v_correction);
    } else if (bf16_m) {
      Update<BFloat16, float>(e, config, m_correction, v_correction);
    } else if (bf16_v) {
      Update<float, BFloat16>(e, config, m_correction, v_correction);
    } else {
      Update<float, float>(e, config, m_correction, v_correction);
    }
    if (e.model.defined()) Cast(e.master, e.model);
  }
}

}  // namespace moe::cpu
