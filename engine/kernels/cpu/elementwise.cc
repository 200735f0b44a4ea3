// CPU elementwise ops and conversions: Fill, Cast, ReadSmallToHost, Add, Scale, Axpy.
// Float tensors are f32, except that Fill and Cast also take bf16 (and Fill any integer dtype and
// e4m3).
// Every op treats its tensors as contiguous from data(), so row views work; outputs may alias
// inputs where op_declarations.inc allows it.
#include <algorithm>
#include <cstring>

#include <glog/logging.h>

#include "engine/core/bfloat16.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

template <typename T>
void FillAs(const Tensor& t, T value) {
  std::fill_n(t.data<T>(), t.numel(), value);
}

}  // namespace

void Fill(const Tensor& t, float value) {
  switch (t.dtype()) {
    case DType::kF32:
      return FillAs<float>(t, value);
    case DType::kBF16:
      return FillAs<BFloat16>(t, FloatToBFloat16(value));
    case DType::kI32:
      return FillAs<int32_t>(t, static_cast<int32_t>(value));
    case DType::kI64:
      return FillAs<int64_t>(t, static_cast<int64_t>(value));
    case DType::kU8:
      return FillAs<uint8_t>(t, static_cast<uint8_t>(value));
    case DType::kE4M3:
      return FillAs<Float8E4M3>(t, FloatToE4M3(value));
  }
  LOG(FATAL) << "fill: unknown dtype of " << t.DebugString();
}

void Cast(const Tensor& src, const Tensor& dst) {
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
  } else if (src.dtype() == DType::kF32) {
    const float* in = src.data<float>();
    BFloat16* out = dst.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
  } else {
    const BFloat16* in = src.data<BFloat16>();
    float* out = dst.data<float>();
    for (int64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
  }
}

// The compute stream runs inline, so src is final: a plain copy.
void ReadSmallToHost(const Tensor& src, void* dst) {
  if (src.nbytes() > 0) std::memcpy(dst, src.data(), src.nbytes());  // an empty tensor has no data
}

void Add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
}

void Scale(const Tensor& x, float alpha, const Tensor& out) {
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) po[i] = alpha * px[i];
}

void Axpy(float alpha, const Tensor& x, const Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) py[i] += alpha * px[i];
}

}  // namespace moe::cpu
