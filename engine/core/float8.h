// FP8 E4M3 on the host: OCP "e4m3fn", the format of Hopper's FP8 tensor cores and of
// torch.float8_e4m3fn. One sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
// S.1111.111 is NaN, so the largest finite magnitude is 448 (S.1111.110); subnormals are
// m * 2^-9 (m = 1..7). Device code uses CUDA's __nv_fp8_e4m3 (cuda_fp8.h), which has the same
// bit layout; FloatToE4M3 computes what the device's cvt.rn.satfinite.e4m3x2.f32 does.
#pragma once

#include <cstdint>

namespace moe {

struct Float8E4M3 {
  uint8_t bits = 0;
};

// The largest finite E4M3 magnitude.
constexpr float kE4M3Max = 448.0f;
// The canonical NaN (what every NaN converts to).
constexpr uint8_t kE4M3NaNBits = 0x7f;

// value rounded to nearest E4M3, ties to even, saturating: a finite value or infinity beyond
// +-448 becomes +-448 (values up to 464 round there anyway); NaN becomes kE4M3NaNBits. Keeps the
// sign of zero (and of values that round to zero).
Float8E4M3 FloatToE4M3(float value);
// Exact: every E4M3 value is an f32 value (NaN becomes a quiet f32 NaN of the same sign).
float E4M3ToFloat(Float8E4M3 value);

}  // namespace moe
