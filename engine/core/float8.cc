#include "engine/core/float8.h"

#include <bit>

namespace moe {
namespace {

constexpr uint32_t kF32Bias = 127, kE4M3Bias = 7;
constexpr uint32_t kF32MantissaBits = 23, kE4M3MantissaBits = 3;
constexpr uint32_t kDroppedBits = kF32MantissaBits - kE4M3MantissaBits;
// |f32| bit patterns: the smallest normal E4M3 magnitude (2^-6) and 448.
constexpr uint32_t kMinNormalBits = (kF32Bias + 1 - kE4M3Bias) << kF32MantissaBits;
constexpr uint32_t kMaxBits = 0x43e00000u;

// x >> shift rounded to nearest, ties to even; 1 <= shift <= 31.
uint32_t ShiftRoundedToNearestEven(uint32_t x, uint32_t shift) {
  const uint32_t kept = x >> shift, rest = x & ((1u << shift) - 1), half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// The E4M3 magnitude bits of |value| (f32 bits `magnitude`, finite, at most 448).
uint8_t MagnitudeBits(uint32_t magnitude) {
  if (magnitude >= kMinNormalBits) {
    // Exponent and mantissa round together: a mantissa carry moves to the next binade. Then
    // rebias the exponent from 127 to 7.
    const uint32_t rounded = ShiftRoundedToNearestEven(magnitude, kDroppedBits);
    return static_cast<uint8_t>(rounded - ((kF32Bias - kE4M3Bias) << kE4M3MantissaBits));
  }
  // Subnormal in E4M3 (m * 2^-9, where m = 8 is the smallest normal): |value| = significand *
  // 2^(exponent - 150), so m = significand * 2^(exponent - 141) rounded. f32 subnormals and
  // anything below 2^-11 are far below half of 2^-9 and round to zero.
  const uint32_t exponent = magnitude >> kF32MantissaBits;
  const uint32_t shift = 141 - exponent;
  if (exponent == 0 || shift > 24) return 0;
  const uint32_t significand =
      (magnitude & ((1u << kF32MantissaBits) - 1)) | (1u << kF32MantissaBits);
  return static_cast<uint8_t>(ShiftRoundedToNearestEven(significand, shift));
}

}  // namespace

Float8E4M3 FloatToE4M3(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return {kE4M3NaNBits};
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint8_t bits = magnitude >= kMaxBits ? 0x7e : MagnitudeBits(magnitude);
  return {static_cast<uint8_t>(sign | bits)};
}

float E4M3ToFloat(Float8E4M3 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x80u) << 24;
  const uint32_t exponent = (value.bits >> kE4M3MantissaBits) & 0xfu;
  const uint32_t mantissa = value.bits & 0x7u;
  if ((value.bits & 0x7fu) == kE4M3NaNBits) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exponent == 0) {  // m * 2^-9, exact in f32
    const float magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + kF32Bias - kE4M3Bias) << kF32MantissaBits) |
                              (mantissa << kDroppedBits));
}

}  // namespace moe
