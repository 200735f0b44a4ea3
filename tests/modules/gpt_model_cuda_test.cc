// The tiny model on CUDA (bf16 compute, f32 master weights) against the CPU reference (f32) from
// the same weights (rounded to bf16 for both) and the same batch: the loss, the aux loss and every
// parameter gradient agree within bf16 tolerance, with either grouped MLP and with f32 or bf16
// gradients (--main_grads_dtype; bf16 on both backends). All experts are chosen, so bf16 rounding
// cannot flip a routing decision and change which function is differentiated.
#include <gtest/gtest.h>

#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "modules/gpt_model.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

struct BackendRun {
  double loss = 0, aux = 0;
  std::map<std::string, std::vector<float>> grads;
};

BackendRun ForwardBackward(const GptConfig& config, Device device, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& targets, DType grad_dtype) {
  ParameterSet parameters(device, device.is_cuda() ? DType::kBF16 : DType::kF32, 42,
                          /*optimizer_state=*/true, OptimizerDTypes{.grad = grad_dtype});
  GptModel model(config, parameters);
  for (const auto& p : parameters.all()) {  // both runs compute with the same bf16 values
    std::vector<float> values = testing::ToFloats(p->master);
    for (float& v : values) v = BFloat16ToFloat(FloatToBFloat16(v));
    ops::CopyFromHost(values.data(), p->master);
  }
  parameters.SyncValuesFromMasters();
  const int64_t tokens = static_cast<int64_t>(ids.size());
  SavedTensors saved;
  const ForwardResult result =
      model.Forward(saved, testing::FromInts(ids, {tokens}, device),
                    testing::FromInts(targets, {tokens}, device), /*loss_grad=*/1.0f / tokens);
  model.Backward(saved, Tensor(), /*aux_grad=*/1.0f);
  BackendRun run;
  run.loss = testing::ToFloats(result.loss_sum)[0] / tokens;
  run.aux = testing::ToFloats(result.aux_loss)[0];
  for (const auto& p : parameters.all()) {
    EXPECT_EQ(p->grad.dtype(), grad_dtype);
    run.grads[p->name] = testing::ToFloats(MaterializedGrad(*p));
  }
  return run;
}

class GptModelCudaTest : public ::testing::TestWithParam<std::tuple<GroupedMlpKind, DType>> {};

TEST_P(GptModelCudaTest, MatchesTheCpuReference) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  const auto [grouped_mlp, grad_dtype] = GetParam();
  GptConfig config;
  config.num_layers = 3;
  config.hidden_size = 128;
  config.num_attention_heads = 2;  // head_dim 64, as the CUDA attention kernels take
  config.num_query_groups = 1;
  config.ffn_hidden_size = 256;
  config.num_experts = 4;
  config.moe_router_topk = 4;
  config.moe_ffn_hidden_size = 96;
  config.moe_z_loss_coeff = 1e-3f;
  config.seq_length = 128;
  config.vocab_size = 512;
  config.init_std = 0.05f;
  config.moe_grouped_mlp = grouped_mlp;
  std::mt19937 rng(testing::TestSeed());
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<int32_t> ids(2 * config.seq_length), targets(ids.size());
  for (auto& t : ids) t = token(rng);
  for (auto& t : targets) t = token(rng);

  const BackendRun cpu = ForwardBackward(config, Device::CPU(), ids, targets, grad_dtype);
  const BackendRun gpu = ForwardBackward(config, Device::CUDA(0), ids, targets, grad_dtype);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-2 * cpu.loss);
  EXPECT_NEAR(gpu.aux, cpu.aux, 1e-2 * std::abs(cpu.aux));
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, want] : cpu.grads) {
    const double error = testing::RelativeError(gpu.grads.at(name), want);
    EXPECT_LE(error, 3e-2) << name;
    if (error > worst) worst = error, worst_name = name;
  }
  printf("loss cpu %.6f cuda %.6f; largest gradient error %.3g (%s)\n", cpu.loss, gpu.loss, worst,
         worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(PathsAndGradients, GptModelCudaTest,
                         ::testing::Combine(::testing::Values(GroupedMlpKind::kUnfused,
                                                              GroupedMlpKind::kFused),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == GroupedMlpKind::kFused
                                                  ? "fused_"
                                                  : "unfused_") +
                                  DTypeName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace moe
