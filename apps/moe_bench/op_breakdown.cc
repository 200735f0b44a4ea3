#include "apps/moe_bench/op_breakdown.h"

#include <functional>

#include "apps/common/median_time.h"
#include "apps/common/random_tensor.h"
#include "engine/core/tensor.h"
#include "engine/kernels/ops.h"

namespace moe {
namespace {

Tensor Constant(const Shape& shape, DType dtype, Device device, float value) {
  Tensor t = Tensor::Empty(shape, dtype, device);
  ops::Fill(t, value);
  return t;
}

// Normal values; the weights (GBs at some shapes) repeat a block of 2^20 drawn on the host.
Tensor Random(const Shape& shape, DType dtype, Device device, float scale, uint32_t seed) {
  return RandomTensor(shape, dtype, device, scale, seed, int64_t{1} << 20);
}

}  // namespace

std::vector<OpTime> TimeFusedMlpOps(const ExpertShape& s, Device device, DType dtype,
                                    DType grad_dtype, int warmup, int iters) {
  std::vector<int32_t> offsets(s.experts + 1);
  for (int64_t g = 0; g <= s.experts; ++g) {
    offsets[g] = static_cast<int32_t>(g * s.rows / s.experts);
  }
  const std::span<const int32_t> rows(offsets);  // host copy, for the cuBLAS path
  const Tensor device_offsets = Tensor::Empty({s.experts + 1}, DType::kI32, device);
  ops::CopyFromHost(offsets.data(), device_offsets);
  const int64_t f = s.ffn, h = s.hidden;
  // Random inputs; every other operand is the output of an op timed before its reader (fc1 -> h1,
  // SwiGLU -> a, fc2 data gradient -> da, SwiGLU backward -> dh), so all GEMMs see real data.
  // "fc1 + swiglu" and "fc2 dgrad + swiglu bwd" are what the fused path runs
  // (ops::GroupedMatmulSwiglu, ops::GroupedMatmulSwigluBackward); the GEMMs and SwiGLU alone show
  // what each saves.
  const Tensor x = Random({s.rows, h}, dtype, device, 1.0f, 1);
  const Tensor w1 = Random({s.experts, 2 * f, h}, dtype, device, 0.02f, 2);
  const Tensor w2 = Random({s.experts, h, f}, dtype, device, 0.02f, 3);
  const Tensor scale = Constant({s.rows}, DType::kF32, device, 0.5f);
  const Tensor h1 = Constant({s.rows, 2 * f}, dtype, device, 0.0f);
  const Tensor a = Constant({s.rows, f}, dtype, device, 0.0f);
  const Tensor y = Constant({s.rows, h}, dtype, device, 0.0f);
  const Tensor dw1 = Constant(w1.shape(), grad_dtype, device, 0.0f);
  const Tensor dw2 = Constant(w2.shape(), grad_dtype, device, 0.0f);
  const Tensor dscale = Constant({s.rows}, DType::kF32, device, 0.0f);
  const Tensor dy = Random({s.rows, h}, dtype, device, 1.0f, 4);
  const Tensor da = Constant({s.rows, f}, dtype, device, 0.0f);
  const Tensor dh = Constant({s.rows, 2 * f}, dtype, device, 0.0f);
  const Tensor dx = Constant({s.rows, h}, dtype, device, 0.0f);

  const auto time = [&](const std::function<void()>& body) {
    for (int i = 0; i < warmup; ++i) body();
    return MedianMs(device, iters, body);
  };
  // One dense GEMM (m, k) x (k, n) of the grouped GEMM's total size.
  const auto dense = [&](int64_t m, int64_t n, int64_t k) {
    const Tensor lhs = Random({m, k}, dtype, device, 1.0f, 5);
    const Tensor rhs = Random({n, k}, dtype, device, 0.02f, 6);
    const Tensor out = Tensor::Empty({m, n}, dtype, device);
    return time([&] { ops::Matmul(lhs, rhs, out, false, true); });
  };
  const auto gemm = [&](const std::string& op, int64_t n, int64_t k,
                        const std::function<void()>& body) {
    return OpTime{op, time(body), 2e-9 * s.rows * n * k, dense(s.rows, n, k)};
  };
  const auto elementwise = [&](const std::string& op, const std::function<void()>& body) {
    return OpTime{op, time(body)};
  };
  return {
      gemm("fc1", 2 * f, h, [&] { ops::GroupedMatmul(x, w1, device_offsets, rows, h1, true); }),
      elementwise("swiglu", [&] { ops::SwigluForward(h1, scale, a); }),
      gemm("fc1 + swiglu", 2 * f, h,
           [&] { ops::GroupedMatmulSwiglu(x, w1, device_offsets, rows, scale, h1, a); }),
      gemm("fc2", h, f, [&] { ops::GroupedMatmul(a, w2, device_offsets, rows, y, true); }),
      gemm("fc2 dgrad", f, h, [&] { ops::GroupedMatmul(dy, w2, device_offsets, rows, da, false); }),
      gemm("fc2 wgrad =", h, f,
           [&] { ops::GroupedMatmulWeightGrad(dy, a, device_offsets, rows, dw2, false); }),
      gemm("fc2 wgrad +=", h, f,
           [&] { ops::GroupedMatmulWeightGrad(dy, a, device_offsets, rows, dw2, true); }),
      elementwise("swiglu bwd", [&] { ops::SwigluBackward(da, h1, scale, dh, dscale); }),
      gemm("fc2 dgrad + swiglu bwd", f, h,
           [&] {
             ops::GroupedMatmulSwigluBackward(dy, w2, device_offsets, rows, h1, scale, dh, dscale);
           }),
      gemm("fc1 dgrad", h, 2 * f,
           [&] { ops::GroupedMatmul(dh, w1, device_offsets, rows, dx, false); }),
      gemm("fc1 wgrad =", 2 * f, h,
           [&] { ops::GroupedMatmulWeightGrad(dh, x, device_offsets, rows, dw1, false); }),
      gemm("fc1 wgrad +=", 2 * f, h,
           [&] { ops::GroupedMatmulWeightGrad(dh, x, device_offsets, rows, dw1, true); }),
  };
}

}  // namespace moe
