// The fused grouped MLP against the unfused one on CUDA in bf16 (f32 master weights and grads),
// from the same weights and inputs: outputs, input gradients, routing-probability gradients and
// expert weight gradients agree within bf16 tolerance, on routings with empty experts, all rows on
// one expert and heavy imbalance.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/device_context.h"
#include "modules/grouped_mlp.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::ToFloats;

constexpr double kBf16Tolerance = 2e-2;

struct PathRun {
  std::vector<float> y, dx, dweights, fc1_grad, fc2_grad;
};

PathRun RunPath(GroupedMlpKind kind, const std::vector<int32_t>& offsets,
                const std::vector<float>& x, const std::vector<float>& weights,
                const std::vector<float>& dy) {
  GptConfig config;
  config.hidden_size = 256;
  config.num_experts = 8;
  config.moe_ffn_hidden_size = 192;
  config.init_std = 0.05f;
  config.moe_grouped_mlp = kind;
  const Device gpu = Device::CUDA(0);
  ParameterSet parameters(gpu, DType::kBF16, /*seed=*/11);
  std::unique_ptr<GroupedMlp> mlp = MakeGroupedMlp(parameters, "experts", config, 0);
  const int64_t rows = offsets.back(), hidden = config.hidden_size;
  SavedTensors saved;
  const Tensor y = mlp->Forward(saved, testing::FromFloats(x, {rows, hidden}, DType::kBF16, gpu),
                                testing::FromInts(offsets, {config.num_experts + 1}, gpu),
                                testing::FromFloats(weights, {rows}, DType::kF32, gpu));
  parameters.ZeroGrads();
  const GroupedMlp::Grads grads =
      mlp->Backward(saved, testing::FromFloats(dy, {rows, hidden}, DType::kBF16, gpu));
  EXPECT_TRUE(saved.empty());
  return {ToFloats(y), ToFloats(grads.dx), ToFloats(grads.dweights),
          ToFloats(parameters.Get("experts.fc1.weight").grad),
          ToFloats(parameters.Get("experts.fc2.weight").grad)};
}

TEST(GroupedMlpCudaTest, FusedMatchesUnfusedInBf16) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  std::mt19937 rng(testing::TestSeed());
  SCOPED_TRACE("seed " + std::to_string(testing::TestSeed()));
  const std::vector<std::pair<std::string, std::vector<int32_t>>> routings = {
      {"empty experts", {0, 130, 0, 41, 7, 0, 300, 1}},
      {"all rows on one expert", {0, 0, 0, 0, 0, 513, 0, 0}},
      {"heavy imbalance", {1, 2, 900, 3, 0, 1, 40, 0}},
      {"every expert", {64, 64, 64, 64, 64, 64, 64, 64}}};
  for (const auto& [name, counts] : routings) {
    SCOPED_TRACE(name);
    std::vector<int32_t> offsets = {0};
    for (int32_t c : counts) offsets.push_back(offsets.back() + c);
    const int64_t rows = offsets.back(), hidden = 256;
    auto bf16_values = [&](int64_t n) {
      std::vector<float> v = testing::RandomFloats(n, rng);
      for (float& f : v) f = BFloat16ToFloat(FloatToBFloat16(f));
      return v;
    };
    const std::vector<float> x = bf16_values(rows * hidden), dy = bf16_values(rows * hidden);
    std::vector<float> weights = testing::RandomFloats(rows, rng);
    for (float& w : weights) w = std::abs(w) + 0.05f;
    const PathRun unfused = RunPath(GroupedMlpKind::kUnfused, offsets, x, weights, dy);
    const PathRun fused = RunPath(GroupedMlpKind::kFused, offsets, x, weights, dy);
    auto expect_close = [&](const char* what, const std::vector<float>& got,
                            const std::vector<float>& want) {
      const double error = testing::RelativeError(got, want);
      EXPECT_LE(error, kBf16Tolerance) << what;
      printf("%-24s %-9s relative error %.3g\n", name.c_str(), what, error);
    };
    expect_close("y", fused.y, unfused.y);
    expect_close("dx", fused.dx, unfused.dx);
    expect_close("dweights", fused.dweights, unfused.dweights);
    expect_close("fc1 grad", fused.fc1_grad, unfused.fc1_grad);
    expect_close("fc2 grad", fused.fc2_grad, unfused.fc2_grad);
  }
}

}  // namespace
}  // namespace moe
