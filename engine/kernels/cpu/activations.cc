// CPU SiLU and SwiGLU, f32.
//   silu(x) = x * sigmoid(x); silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
//   SwiGLU: x (rows, 2f) = [gate | up]; y (rows, f) = silu(gate) * up * scale[row] (scale
//   undefined = 1). Backward: dgate = dy*scale*up*silu'(gate), dup = dy*scale*silu(gate) (=);
//   dscale (rows) = sum_j silu(gate) * up * dy (=, skipped when undefined).
#include <cmath>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float Silu(float x) { return x * Sigmoid(x); }

float SiluGrad(float x) {
  const float s = Sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

}  // namespace

void SiluForward(const Tensor& x, const Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) py[i] = Silu(px[i]);
}

void SiluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  float* pdx = dx.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) pdx[i] = pdy[i] * SiluGrad(px[i]);
}

void SwigluForward(const Tensor& x, const Tensor& scale, const Tensor& y) {
  const int64_t rows = x.dim(0), f = y.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x.data<float>() + r * 2 * f;
    const float* up = gate + f;
    float* yr = y.data<float>() + r * f;
    const float s = scale.defined() ? scale.data<float>()[r] : 1.0f;
    for (int64_t j = 0; j < f; ++j) yr[j] = Silu(gate[j]) * up[j] * s;
  }
}

void SwigluBackward(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& dx,
                    const Tensor& dscale) {
  const int64_t rows = x.dim(0), f = dy.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x.data<float>() + r * 2 * f;
    const float* up = gate + f;
    const float* dyr = dy.data<float>() + r * f;
    const float s = scale.defined() ? scale.data<float>()[r] : 1.0f;
    double ds = 0;
    for (int64_t j = 0; j < f; ++j) {
      const float silu = Silu(gate[j]);
      ds += static_cast<double>(silu) * up[j] * dyr[j];
      if (dx.defined()) {
        float* const dgate = dx.data<float>() + r * 2 * f;
        dgate[j] = dyr[j] * s * up[j] * SiluGrad(gate[j]);
        dgate[f + j] = dyr[j] * s * silu;
      }
    }
    if (dscale.defined()) dscale.data<float>()[r] = static_cast<float>(ds);
  }
}

}  // namespace moe::cpu
