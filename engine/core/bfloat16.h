// bfloat16 on the host: the upper 16 bits of an IEEE float, rounded to nearest even.
// Device code uses CUDA's __nv_bfloat16, which has the same bit layout.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/core/dtype.h"

namespace moe {

struct BFloat16 {
  uint16_t bits = 0;
};

inline BFloat16 FloatToBFloat16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  BFloat16 out;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    out.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    return out;
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  out.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  return out;
}

inline float BFloat16ToFloat(BFloat16 value) {
  const uint32_t u = static_cast<uint32_t>(value.bits) << 16;
  float out;
  std::memcpy(&out, &u, sizeof(out));
  return out;
}

// f32 and bf16 storage alike, for host code templated on it.
inline float ToFloat(float value) { return value; }
inline float ToFloat(BFloat16 value) { return BFloat16ToFloat(value); }
template <typename T>
T FromFloat(float value);
template <>
inline float FromFloat<float>(float value) {
  return value;
}
template <>
inline BFloat16 FromFloat<BFloat16>(float value) {
  return FloatToBFloat16(value);
}

// Calls fn(StorageTag<T>{}) with T = BFloat16 for DType::kBF16, else float (the caller has
// checked `dtype` is one of the two); use with [&]<typename T>(StorageTag<T>) {...}.
template <typename T>
struct StorageTag {};
template <typename Fn>
void DispatchStorage(DType dtype, Fn&& fn) {
  if (dtype == DType::kBF16) {
    fn(StorageTag<BFloat16>{});
  } else {
    fn(StorageTag<float>{});
  }
}

}  // namespace moe
