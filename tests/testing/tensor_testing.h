// Test helpers: tensors from host values, host values from tensors (bf16 and e4m3 widened to
// float), fresh random inputs, poisoning outputs, and the relative error every comparison uses.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/core/tensor.h"

namespace moe::testing {

Tensor FromFloats(const std::vector<float>& values, const Shape& shape, DType dtype, Device device);
Tensor FromInts(const std::vector<int32_t>& values, const Shape& shape, Device device);
std::vector<float> ToFloats(const Tensor& t);  // f32, bf16 or e4m3 (all exactly)
std::vector<int32_t> ToInts(const Tensor& t);  // i32
// The bits of ToFloats(t), for bit-identity checks (NaN compares equal to itself).
std::vector<uint32_t> FloatBits(const Tensor& t);

// Normal(0, scale) values; each call draws fresh numbers from `rng`.
std::vector<float> RandomFloats(int64_t n, std::mt19937& rng, float scale = 1.0f);
Tensor RandomTensor(const Shape& shape, DType dtype, Device device, std::mt19937& rng,
                    float scale = 1.0f);

// Every byte 0xFF: NaN in f32 and bf16, -1 in i32, so an element an op forgets to write fails.
void Poison(const Tensor& t);
// An output tensor, poisoned.
Tensor PoisonedTensor(const Shape& shape, DType dtype, Device device);

// ||got - want|| / max(||want||, tiny); infinity if any element of `got` is NaN or inf.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want);

// A seed that differs per test run unless MOE_TEST_SEED is set (printed on failure by callers).
uint32_t TestSeed();

}  // namespace moe::testing
