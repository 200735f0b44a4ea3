// CUDA AdamW step (contract: engine/kernels/op_declarations.inc), elementwise, in place on f32
// master weights, grad, m, v (n); the CPU reference's formula and operation order:
//   g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   master -= lr * (wd * master + m * m_corr / (sqrt(v * v_corr) + eps)),
//   m_corr = 1 / (1 - b1^step), v_corr = 1 / (1 - b2^step) (computed in double on the host).
// model (f32 or bf16), when defined, receives the new master values.
#include <cmath>

#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, m_correction, v_correction;
};

template <typename M>
__global__ void AdamWKernel(float* master, const float* grad, float* m, float* v, int64_t n,
                            AdamWStep p, M* model) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = p.grad_scale * grad[i];
    const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * g;
    const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
    const float update = mi * p.m_correction / (sqrtf(vi * p.v_correction) + p.eps);
    const float w = master[i] - p.lr * (p.weight_decay * master[i] + update);
    m[i] = mi;
    v[i] = vi;
    master[i] = w;
    if (model != nullptr) model[i] = FromFloat<M>(w);
  }
}

}  // namespace

void AdamWUpdate(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const AdamWConfig& config, const Tensor& model) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const auto step = static_cast<double>(config.step);
  const AdamWStep p = {
      config.lr,
      config.beta1,
      config.beta2,
      config.eps,
      config.weight_decay,
      config.grad_scale,
      static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, step))),
      static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, step))),
  };
  const auto launch = [&]<typename M>(TypeTag<M>) {
    constexpr int kThreads = 256;
    AdamWKernel<M><<<BlocksFor(n, kThreads), kThreads, 0, StreamOf(master)>>>(
        Ptr<float>(master), Ptr<const float>(grad), Ptr<float>(m), Ptr<float>(v), n, p,
        Ptr<M>(model));
    MOE_CUDA_CHECK_LAUNCH();
  };
  if (model.defined()) {
    DispatchFloat(model.dtype(), launch);
  } else {
    launch(TypeTag<float>{});
  }
}

}  // namespace moe::cuda
