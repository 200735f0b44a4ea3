#include "tests/testing/tensor_testing.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <glog/logging.h>

#include "engine/core/bfloat16.h"
#include "engine/core/float8.h"
#include "engine/kernels/ops.h"

namespace moe::testing {

Tensor FromFloats(const std::vector<float>& values, const Shape& shape, DType dtype,
                  Device device) {
  CHECK_EQ(static_cast<int64_t>(values.size()), NumElements(shape));
  Tensor t = Tensor::Empty(shape, dtype, device);
  if (dtype == DType::kF32) {
    ops::CopyFromHost(values.data(), t);
  } else {
    CHECK(dtype == DType::kBF16);
    std::vector<BFloat16> narrow(values.size());
    for (size_t i = 0; i < values.size(); ++i) narrow[i] = FloatToBFloat16(values[i]);
    ops::CopyFromHost(narrow.data(), t);
  }
  return t;
}

Tensor FromInts(const std::vector<int32_t>& values, const Shape& shape, Device device) {
  CHECK_EQ(static_cast<int64_t>(values.size()), NumElements(shape));
  Tensor t = Tensor::Empty(shape, DType::kI32, device);
  ops::CopyFromHost(values.data(), t);
  return t;
}

std::vector<uint32_t> FloatBits(const Tensor& t) {
  const std::vector<float> values = ToFloats(t);
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

namespace {
// t's elements, stored as T, widened to float by `widen`.
template <typename T, typename Widen>
std::vector<float> Widened(const Tensor& t, Widen widen) {
  std::vector<T> narrow(t.numel());
  ops::CopyToHost(t, narrow.data());
  std::vector<float> out;
  out.reserve(narrow.size());
  for (const T& v : narrow) out.push_back(widen(v));
  return out;
}
}  // namespace

std::vector<float> ToFloats(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kBF16:
      return Widened<BFloat16>(t, BFloat16ToFloat);
    case DType::kE4M3:
      return Widened<Float8E4M3>(t, E4M3ToFloat);
    default:
      CHECK(t.dtype() == DType::kF32) << t.DebugString();
      std::vector<float> out(t.numel());
      ops::CopyToHost(t, out.data());
      return out;
  }
}

std::vector<int32_t> ToInts(const Tensor& t) {
  CHECK(t.dtype() == DType::kI32) << t.DebugString();
  std::vector<int32_t> out(t.numel());
  ops::CopyToHost(t, out.data());
  return out;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = normal(rng);
  return out;
}

Tensor RandomTensor(const Shape& shape, DType dtype, Device device, std::mt19937& rng,
                    float scale) {
  return FromFloats(RandomFloats(NumElements(shape), rng, scale), shape, dtype, device);
}

void Poison(const Tensor& t) {
  std::vector<unsigned char> bytes(t.nbytes(), 0xFF);
  ops::CopyFromHost(bytes.data(), t);
}

Tensor PoisonedTensor(const Shape& shape, DType dtype, Device device) {
  Tensor t = Tensor::Empty(shape, dtype, device);
  Poison(t);
  return t;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  CHECK_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

uint32_t TestSeed() {
  if (const char* env = std::getenv("MOE_TEST_SEED")) return static_cast<uint32_t>(std::atoi(env));
  static const uint32_t seed = std::random_device{}();
  return seed;
}

}  // namespace moe::testing
