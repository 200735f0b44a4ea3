// FP8 E4M3 on the host (engine/core/float8.h): every bit pattern decodes and re-encodes to
// itself, rounding is to nearest with ties to even at every pair of neighbours (normal and
// subnormal), and agrees with an independent nearest-value search; values beyond 448 saturate,
// NaN stays NaN (canonical) and zero keeps its sign.
#include "engine/core/float8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace moe {
namespace {

float Decode(int bits) { return E4M3ToFloat({static_cast<uint8_t>(bits)}); }
int Encode(float value) { return FloatToE4M3(value).bits; }
bool IsNaNPattern(int bits) { return (bits & 0x7f) == 0x7f; }

TEST(Float8E4M3Test, DecodesTheFormatsLandmarks) {
  EXPECT_EQ(Decode(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Decode(0x80)) && Decode(0x80) == 0.0f);
  EXPECT_EQ(Decode(0x01), std::ldexp(1.0f, -9));      // smallest subnormal
  EXPECT_EQ(Decode(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
  EXPECT_EQ(Decode(0x08), std::ldexp(1.0f, -6));      // smallest normal
  EXPECT_EQ(Decode(0x38), 1.0f);                      // exponent 7 = bias
  EXPECT_EQ(Decode(0x3b), 1.375f);
  EXPECT_EQ(Decode(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(Decode(0xfe), -448.0f);
  EXPECT_EQ(Decode(0x77), 240.0f);  // S.1110.111: a normal value, not inf
  EXPECT_TRUE(std::isnan(Decode(0x7f)));
  EXPECT_TRUE(std::isnan(Decode(0xff)));
  EXPECT_EQ(kE4M3Max, 448.0f);
}

TEST(Float8E4M3Test, EveryBitPatternRoundTrips) {
  for (int bits = 0; bits < 256; ++bits) {
    const int expected = IsNaNPattern(bits) ? kE4M3NaNBits : bits;
    EXPECT_EQ(Encode(Decode(bits)), expected) << "bits 0x" << std::hex << bits;
  }
}

// Between every two neighbouring finite values of one sign (0 and 2^-9 up to 416 and 448), the
// midpoint goes to the even pattern (the one whose mantissa ends in 0), and the f32 values either
// side of it to the nearer neighbour.
TEST(Float8E4M3Test, RoundsToNearestWithTiesToEven) {
  for (const int sign : {0x00, 0x80}) {
    for (int bits = 0; bits < 0x7e; ++bits) {
      const float lo = Decode(sign | bits), hi = Decode(sign | (bits + 1));
      const float mid = (lo + hi) / 2;  // exact: both have at most 4 significant bits
      const int even = sign | (bits % 2 == 0 ? bits : bits + 1);
      EXPECT_EQ(Encode(mid), even) << "between " << lo << " and " << hi;
      EXPECT_EQ(Encode(std::nextafter(mid, lo)), sign | bits) << "just inside " << lo;
      EXPECT_EQ(Encode(std::nextafter(mid, hi)), sign | (bits + 1)) << "just inside " << hi;
    }
  }
  // The same rule at a few places, spelled out.
  EXPECT_EQ(Decode(Encode(1.0625f)), 1.0f);   // between 1 (even) and 1.125
  EXPECT_EQ(Decode(Encode(1.1875f)), 1.25f);  // between 1.125 and 1.25 (even)
  EXPECT_EQ(Decode(Encode(96.0f)), 96.0f);
  EXPECT_EQ(Decode(Encode(100.0f)), 96.0f);   // between 96 (even) and 104
  EXPECT_EQ(Decode(Encode(108.0f)), 112.0f);  // between 104 and 112 (even)
  const float sub = std::ldexp(1.0f, -9);     // the subnormal step
  EXPECT_EQ(Decode(Encode(0.5f * sub)), 0.0f);
  EXPECT_EQ(Decode(Encode(1.5f * sub)), 2 * sub);
  EXPECT_EQ(Decode(Encode(2.5f * sub)), 2 * sub);
  EXPECT_EQ(Decode(Encode(7.5f * sub)), 8 * sub);  // into the smallest normal, 2^-6
  EXPECT_EQ(Encode(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(Encode(std::ldexp(1.0f, -11)), 0x00);
}

// Against an independent reference: the nearest of the 127 finite magnitudes, found by search in
// double (a tie to the even pattern), saturating beyond 448, for values spread log-uniformly over
// 2^-14 to 2^10 and both signs.
TEST(Float8E4M3Test, AgreesWithANearestValueSearch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> log2_magnitude(-14.0, 10.0);
  for (int trial = 0; trial < 200000; ++trial) {
    const float value = static_cast<float>(std::exp2(log2_magnitude(rng))) * (trial % 2 ? -1 : 1);
    const double magnitude = std::abs(static_cast<double>(value));
    int best = 0;
    for (int bits = 1; bits <= 0x7e; ++bits) {
      const double d = std::abs(Decode(bits) - magnitude);
      const double best_d = std::abs(Decode(best) - magnitude);
      if (d < best_d || (d == best_d && bits % 2 == 0)) best = bits;
    }
    EXPECT_EQ(Encode(value), (value < 0 ? 0x80 : 0) | best) << "value " << value;
  }
}

// Finite values beyond the largest (448) and infinities become +-448, as the device's
// cvt.rn.satfinite does. 464, halfway to 480 (which would be S.1111.111, NaN), is the largest value
// that rounds to 448 anyway (a tie to the even 448); anything above would round beyond it.
TEST(Float8E4M3Test, SaturatesAtTheLargestFiniteValue) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Encode(1e6f), 0x7e);
  EXPECT_EQ(Encode(-1e6f), 0xfe);
  EXPECT_EQ(Encode(464.0f), 0x7e);
  EXPECT_EQ(Encode(std::nextafter(464.0f, inf)), 0x7e);
  EXPECT_EQ(Encode(-std::nextafter(464.0f, inf)), 0xfe);
  EXPECT_EQ(Encode(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(Encode(inf), 0x7e);
  EXPECT_EQ(Encode(-inf), 0xfe);
  // The lower edge of 448's interval: 432 ties to 448 (even); below it lies 416.
  EXPECT_EQ(Encode(432.0f), 0x7e);
  EXPECT_EQ(Decode(Encode(std::nextafter(432.0f, 0.0f))), 416.0f);
}

TEST(Float8E4M3Test, NaNStaysNaN) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Encode(quiet), kE4M3NaNBits);
  EXPECT_EQ(Encode(-quiet), kE4M3NaNBits);
  EXPECT_EQ(Encode(std::numeric_limits<float>::signaling_NaN()), kE4M3NaNBits);
  EXPECT_TRUE(std::isnan(Decode(kE4M3NaNBits)));
}

TEST(Float8E4M3Test, KeepsTheSignOfZero) {
  EXPECT_EQ(Encode(0.0f), 0x00);
  EXPECT_EQ(Encode(-0.0f), 0x80);
  EXPECT_EQ(Encode(-1e-10f), 0x80);  // rounds to zero, keeps its sign
  EXPECT_EQ(Encode(1e-10f), 0x00);
  EXPECT_TRUE(std::signbit(Decode(0x80)));
  EXPECT_FALSE(std::signbit(Decode(0x00)));
}

}  // namespace
}  // namespace moe
