// The grouped MLP on CUDA in bf16 (f32 master weights and grads) against the CPU reference (f32,
// the same bf16-rounded weights and inputs), both paths: outputs, input gradients,
// routing-probability gradients and expert weight gradients agree within bf16 tolerance, on
// routings with empty experts, all rows on one expert, heavy imbalance and row counts off the
// Hopper kernels' 128-row tiles (hidden and ffn are multiples of 8, which they take). And the
// fused path waits for the device (reads the offsets back) exactly where its grouped GEMMs need
// host offsets: never on the Hopper kernels.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/core/cuda_check.h"
#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "modules/grouped_mlp.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::ToFloats;

constexpr double kBf16Tolerance = 2e-2;

GptConfig MlpConfig(GroupedMlpKind kind) {
  GptConfig config;
  config.hidden_size = 256;
  config.num_experts = 8;
  config.moe_ffn_hidden_size = 192;
  config.init_std = 0.05f;
  config.moe_grouped_mlp = kind;
  return config;
}

std::vector<float> RoundedToBf16(std::vector<float> v) {
  for (float& f : v) f = BFloat16ToFloat(FloatToBFloat16(f));
  return v;
}

// On the CPU: the parameters' f32 values rounded to bf16, the values the CUDA run holds.
void RoundToBf16(ParameterSet& parameters) {
  for (const auto& p : parameters.all()) {
    ops::CopyFromHost(RoundedToBf16(ToFloats(p->value)).data(), p->value);
  }
}

struct PathRun {
  std::vector<float> y, dx, dweights, fc1_grad, fc2_grad;
};

// One forward and backward on `device`: bf16 on CUDA, f32 on the CPU from the same bf16-rounded
// weights (x and dy are bf16 values already).
PathRun RunPath(Device device, GroupedMlpKind kind, const std::vector<int32_t>& offsets,
                const std::vector<float>& x, const std::vector<float>& weights,
                const std::vector<float>& dy) {
  const GptConfig config = MlpConfig(kind);
  const DType dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
  ParameterSet parameters(device, dtype, /*seed=*/11);
  std::unique_ptr<GroupedMlp> mlp = MakeGroupedMlp(parameters, "experts", config, 0);
  if (!device.is_cuda()) RoundToBf16(parameters);
  const int64_t rows = offsets.back(), hidden = config.hidden_size;
  SavedTensors saved;
  const Tensor y = mlp->Forward(saved, testing::FromFloats(x, {rows, hidden}, dtype, device),
                                testing::FromInts(offsets, {config.num_experts + 1}, device),
                                testing::FromFloats(weights, {rows}, DType::kF32, device));
  parameters.ZeroGrads();
  const GroupedMlp::Grads grads =
      mlp->Backward(saved, testing::FromFloats(dy, {rows, hidden}, dtype, device),
                    /*last_of_step=*/true);
  EXPECT_TRUE(saved.empty());
  return {ToFloats(y), ToFloats(grads.dx), ToFloats(grads.dweights),
          ToFloats(MaterializedGrad(parameters.Get("experts.fc1.weight"))),
          ToFloats(MaterializedGrad(parameters.Get("experts.fc2.weight")))};
}

TEST(GroupedMlpCudaTest, BothPathsMatchTheCpuReferenceInBf16) {
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
    const std::vector<float> x = RoundedToBf16(testing::RandomFloats(rows * hidden, rng));
    const std::vector<float> dy = RoundedToBf16(testing::RandomFloats(rows * hidden, rng));
    std::vector<float> weights = testing::RandomFloats(rows, rng);
    for (float& w : weights) w = std::abs(w) + 0.05f;
    const PathRun cpu = RunPath(Device::CPU(), GroupedMlpKind::kFused, offsets, x, weights, dy);
    for (GroupedMlpKind kind : {GroupedMlpKind::kUnfused, GroupedMlpKind::kFused}) {
      const char* path = kind == GroupedMlpKind::kFused ? "fused" : "unfused";
      SCOPED_TRACE(path);
      const PathRun gpu = RunPath(Device::CUDA(0), kind, offsets, x, weights, dy);
      auto expect_close = [&](const char* what, const std::vector<float>& got,
                              const std::vector<float>& want) {
        const double error = testing::RelativeError(got, want);
        EXPECT_LE(error, kBf16Tolerance) << what;
        printf("%-24s %-8s %-9s relative error vs CPU %.3g\n", name.c_str(), path, what, error);
      };
      expect_close("y", gpu.y, cpu.y);
      expect_close("dx", gpu.dx, cpu.dx);
      expect_close("dweights", gpu.dweights, cpu.dweights);
      expect_close("fc1 grad", gpu.fc1_grad, cpu.fc1_grad);
      expect_close("fc2 grad", gpu.fc2_grad, cpu.fc2_grad);
    }
  }
}

// Three micro-batches of one step through the fused path on `device` (the inputs as RunPath's),
// weight gradients once per `wgrad_micro_batches`: the expert gradients at the end, and whether
// they were still unwritten after each backward.
struct MicroBatchesRun {
  std::vector<float> fc1_grad, fc2_grad;
  std::vector<bool> unwritten_after;
};

MicroBatchesRun RunMicroBatches(Device device, int64_t wgrad_micro_batches,
                                const std::vector<std::vector<int32_t>>& counts, uint32_t seed) {
  GptConfig config = MlpConfig(GroupedMlpKind::kFused);
  config.moe_wgrad_micro_batches = wgrad_micro_batches;
  const DType dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
  ParameterSet parameters(device, dtype, /*seed=*/11);
  std::unique_ptr<GroupedMlp> mlp = MakeGroupedMlp(parameters, "experts", config, 0);
  if (!device.is_cuda()) RoundToBf16(parameters);
  Parameter& fc1 = parameters.Get("experts.fc1.weight");
  std::mt19937 rng(seed);
  parameters.ZeroGrads();
  MicroBatchesRun run;
  for (size_t m = 0; m < counts.size(); ++m) {
    std::vector<int32_t> offsets = {0};
    for (int32_t c : counts[m]) offsets.push_back(offsets.back() + c);
    const int64_t rows = offsets.back(), hidden = config.hidden_size;
    const std::vector<float> x = RoundedToBf16(testing::RandomFloats(rows * hidden, rng));
    const std::vector<float> dy = RoundedToBf16(testing::RandomFloats(rows * hidden, rng));
    std::vector<float> weights = testing::RandomFloats(rows, rng);
    for (float& w : weights) w = std::abs(w) + 0.05f;
    SavedTensors saved;
    mlp->Forward(saved, testing::FromFloats(x, {rows, hidden}, dtype, device),
                 testing::FromInts(offsets, {config.num_experts + 1}, device),
                 testing::FromFloats(weights, {rows}, DType::kF32, device));
    mlp->Backward(saved, testing::FromFloats(dy, {rows, hidden}, dtype, device),
                  /*last_of_step=*/m + 1 == counts.size());
    run.unwritten_after.push_back(fc1.grad_pending_zero);
  }
  run.fc1_grad = ToFloats(MaterializedGrad(fc1));
  run.fc2_grad = ToFloats(MaterializedGrad(parameters.Get("experts.fc2.weight")));
  return run;
}

// On a Hopper GPU the three micro-batches' weight gradients are one kernel launch over three
// parts of rows (sm90 kernels) where each was one launch before: against the CPU's, which adds
// them one by one.
TEST(GroupedMlpCudaTest, WeightGradsOncePerMicroBatchesMatchTheCpuReference) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::vector<int32_t>> counts = {
      {0, 130, 0, 41, 7, 0, 300, 1}, {0, 0, 0, 0, 0, 513, 0, 0}, {64, 64, 64, 64, 64, 64, 64, 64}};
  const MicroBatchesRun cpu = RunMicroBatches(Device::CPU(), 1, counts, seed);
  for (const int64_t n : {1, 3}) {
    SCOPED_TRACE("once per " + std::to_string(n));
    const MicroBatchesRun gpu = RunMicroBatches(Device::CUDA(0), n, counts, seed);
    EXPECT_LE(testing::RelativeError(gpu.fc1_grad, cpu.fc1_grad), kBf16Tolerance) << "fc1 grad";
    EXPECT_LE(testing::RelativeError(gpu.fc2_grad, cpu.fc2_grad), kBf16Tolerance) << "fc2 grad";
    EXPECT_EQ(gpu.unwritten_after, (std::vector<bool>{n > 1, n > 2, false}));
  }
}

// Holds a device's compute stream (a host function on it) until Release() or kHoldLimit. While
// it holds, host code that waits for the stream waits until the limit; timed_out() says
// whether the limit ended the hold (valid once the stream has passed it).
class StreamHold {
 public:
  static constexpr std::chrono::seconds kHoldLimit{10};

  explicit StreamHold(Stream& stream) {
    MOE_CUDA_CALL(
        cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.native_handle()), &Hold, this));
  }
  void Release() { released_ = true; }
  bool timed_out() const { return timed_out_; }

 private:
  static void Hold(void* self) {
    auto* hold = static_cast<StreamHold*>(self);
    const auto limit = std::chrono::steady_clock::now() + kHoldLimit;
    while (!hold->released_ && std::chrono::steady_clock::now() < limit) {
      std::this_thread::yield();
    }
    hold->timed_out_ = !hold->released_;
  }
  std::atomic<bool> released_{false}, timed_out_{false};
};

TEST(GroupedMlpCudaTest, FusedPathWaitsForTheDeviceOnlyWhereItNeedsHostOffsets) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  const Device gpu = Device::CUDA(0);
  const GptConfig config = MlpConfig(GroupedMlpKind::kFused);
  ParameterSet parameters(gpu, DType::kBF16, /*seed=*/11);
  std::unique_ptr<GroupedMlp> mlp = MakeGroupedMlp(parameters, "experts", config, 0);
  const bool needs_host =
      ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kBF16,
                                         parameters.Get("experts.fc1.weight").value.shape()) ||
      ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kBF16,
                                         parameters.Get("experts.fc2.weight").value.shape());
  printf("grouped GEMMs on this GPU: %s\n", needs_host ? "cuBLAS (host offsets)" : "sm90 kernels");

  std::mt19937 rng(testing::TestSeed());
  const std::vector<int32_t> offsets = {0, 130, 130, 171, 178, 178, 478, 479, 480};
  const int64_t rows = offsets.back(), hidden = config.hidden_size;
  const Tensor x = testing::RandomTensor({rows, hidden}, DType::kBF16, gpu, rng);
  const Tensor dy = testing::RandomTensor({rows, hidden}, DType::kBF16, gpu, rng);
  const Tensor weights = testing::RandomTensor({rows}, DType::kF32, gpu, rng);
  const Tensor device_offsets = testing::FromInts(offsets, {config.num_experts + 1}, gpu);
  auto forward_backward = [&] {
    SavedTensors saved;
    mlp->Forward(saved, x, device_offsets, weights);
    mlp->Backward(saved, dy, /*last_of_step=*/true);
  };
  forward_backward();  // loads the kernels and fills the allocator's cache first
  Stream& stream = DeviceContext::Get(gpu).compute_stream();
  stream.Synchronize();

  StreamHold hold(stream);
  forward_backward();
  hold.Release();
  stream.Synchronize();
  EXPECT_EQ(hold.timed_out(), needs_host)
      << (needs_host ? "the cuBLAS path did not read the offsets back"
                     : "the fused path waited for the device on the sm90 kernels");
}

}  // namespace
}  // namespace moe
