// Finite-difference gradient checks, and the fixture the op tests share.
//
// A check differentiates a scalar loss, usually L = sum(out * R) with a fixed random R, with
// respect to one f32 input by central differences, (L(x + eps) - L(x - eps)) / (2 eps), on a
// random sample of that input's elements, and compares the numeric gradient with the analytic
// one on the same elements. The loss is recomputed from the current contents of the inputs, so
// the closure runs the forward op itself.
//
// Chosen for fp32 forward passes on inputs of scale ~1 and a few hundred outputs: eps = 5e-3
// balances the truncation error (~eps^2 f'''/6) against the cancellation error (~1e-7 |L| /
// eps). The sharpest loss here, attention with query/key norms over 6-wide heads (curving as
// 1 / rms^3 of a head's vector), stays near half of the tolerance over hundreds of seeds and the
// CPU op tests near 1e-4, so a relative error of 1e-3 over the sampled gradient vector still
// catches a wrong term, factor or missing accumulation (errors of percents).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace moe::testing {

inline constexpr double kGradTolerance = 1e-3;

struct GradCheckOptions {
  float eps = 5e-3f;         // absolute perturbation of one element
  int64_t max_samples = 48;  // elements perturbed; every element if the input is smaller
};

// sum_i t[i] * weights[i], in double: the scalar the checks differentiate.
double WeightedSum(const Tensor& t, const std::vector<float>& weights);

// ||analytic - numeric|| / ||numeric|| over the sampled elements of `input` (f32); infinity if
// the analytic gradient holds NaN. `analytic` has input.numel() values. `input` is restored.
double GradCheckError(const Tensor& input, const std::vector<float>& analytic,
                      const std::function<double()>& loss, std::mt19937& rng,
                      const GradCheckOptions& options = {});

// A fixture for op tests on one device: a generator seeded from TestSeed() (the seed is part of
// every failure message), tensor factories, and the gradient check as an expectation.
class OpTest : public ::testing::Test {
 protected:
  explicit OpTest(Device device = Device::CPU());

  Tensor Random(const Shape& shape, float scale = 1.0f);  // f32, Normal(0, scale)
  Tensor Poisoned(const Shape& shape, DType dtype = DType::kF32);
  Tensor Floats(const std::vector<float>& values, const Shape& shape);  // f32
  Tensor Zeros(const Shape& shape);                                     // f32
  Tensor Ints(const std::vector<int32_t>& values, const Shape& shape);
  std::vector<int32_t> RandomInts(int64_t n, int32_t bound);  // uniform in [0, bound)

  // GradCheckError(input, analytic, loss) < kGradTolerance, labelled `name` on failure.
  void ExpectGradient(const std::string& name, const Tensor& input,
                      const std::vector<float>& analytic, const std::function<double()>& loss);

  const Device device_;
  std::mt19937 rng_;

 private:
  ::testing::ScopedTrace seed_trace_;
};

}  // namespace moe::testing
