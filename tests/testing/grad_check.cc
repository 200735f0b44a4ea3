#include "tests/testing/grad_check.h"

#include <algorithm>
#include <numeric>

#include <glog/logging.h>

#include "engine/kernels/ops.h"
#include "tests/testing/tensor_testing.h"

namespace moe::testing {

double WeightedSum(const Tensor& t, const std::vector<float>& weights) {
  const std::vector<float> values = ToFloats(t);
  CHECK_EQ(values.size(), weights.size());
  double sum = 0;
  for (size_t i = 0; i < values.size(); ++i) sum += static_cast<double>(values[i]) * weights[i];
  return sum;
}

double GradCheckError(const Tensor& input, const std::vector<float>& analytic,
                      const std::function<double()>& loss, std::mt19937& rng,
                      const GradCheckOptions& options) {
  CHECK(input.dtype() == DType::kF32) << input.DebugString();
  CHECK_EQ(static_cast<int64_t>(analytic.size()), input.numel());
  std::vector<int64_t> samples(input.numel());
  std::iota(samples.begin(), samples.end(), 0);
  std::shuffle(samples.begin(), samples.end(), rng);
  samples.resize(std::min<int64_t>(samples.size(), options.max_samples));

  std::vector<float> values = ToFloats(input);
  std::vector<float> got, numeric;
  for (int64_t i : samples) {
    const float original = values[i];
    // Divide by the difference of the perturbed values as stored, so their rounding cancels.
    const float plus = original + options.eps, minus = original - options.eps;
    values[i] = plus;
    ops::CopyFromHost(values.data(), input);
    const double loss_plus = loss();
    values[i] = minus;
    ops::CopyFromHost(values.data(), input);
    const double loss_minus = loss();
    values[i] = original;
    ops::CopyFromHost(values.data(), input);
    numeric.push_back(static_cast<float>((loss_plus - loss_minus) / (plus - minus)));
    got.push_back(analytic[i]);
  }
  return RelativeError(got, numeric);
}

OpTest::OpTest(Device device)
    : device_(device),
      rng_(TestSeed()),
      seed_trace_(__FILE__, __LINE__, "seed " + std::to_string(TestSeed())) {}

Tensor OpTest::Random(const Shape& shape, float scale) {
  return RandomTensor(shape, DType::kF32, device_, rng_, scale);
}

Tensor OpTest::Poisoned(const Shape& shape, DType dtype) {
  return PoisonedTensor(shape, dtype, device_);
}

Tensor OpTest::Floats(const std::vector<float>& values, const Shape& shape) {
  return FromFloats(values, shape, DType::kF32, device_);
}

Tensor OpTest::Zeros(const Shape& shape) {
  return Floats(std::vector<float>(NumElements(shape), 0.0f), shape);
}

Tensor OpTest::Ints(const std::vector<int32_t>& values, const Shape& shape) {
  return FromInts(values, shape, device_);
}

std::vector<int32_t> OpTest::RandomInts(int64_t n, int32_t bound) {
  std::uniform_int_distribution<int32_t> uniform(0, bound - 1);
  std::vector<int32_t> out(n);
  for (int32_t& v : out) v = uniform(rng_);
  return out;
}

void OpTest::ExpectGradient(const std::string& name, const Tensor& input,
                            const std::vector<float>& analytic,
                            const std::function<double()>& loss) {
  SCOPED_TRACE(name);
  EXPECT_LT(GradCheckError(input, analytic, loss, rng_), kGradTolerance);
}

}  // namespace moe::testing
