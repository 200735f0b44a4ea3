// Selective recompute (GptConfig::recompute) on the whole model: training is bit-identical to no
// recompute for every module and path; each module stops keeping exactly what it recomputes; the
// device peak falls by about the bytes no longer kept.
//
// One source, two binaries (tests/CMakeLists.txt): recompute_test on the CPU backend and, with
// MOE_TEST_ON_CUDA, recompute_cuda_test on a GPU (bf16; the same kernels run twice on the same
// inputs, so recompute is exact wherever the forward kernels are deterministic).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/device_context.h"
#include "modules/gpt_model.h"
#include "modules/trainer.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/test_device.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const Device kDevice = testing::kTestDevice;
constexpr DType kCompute = testing::kTestCompute;

struct Case {
  std::string name;
  RecomputeModules recompute;
  GroupedMlpKind mlp;
  int64_t num_layers = -1;  // GptConfig::recompute_num_layers
  bool qk_norm = false;     // Qwen3's query/key norm, on a head dim other than hidden / heads
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (GroupedMlpKind mlp : {GroupedMlpKind::kFused, GroupedMlpKind::kUnfused}) {
    const std::string path = mlp == GroupedMlpKind::kFused ? "_fused" : "_unfused";
    RecomputeModules r;
    r.layernorm = true;
    cases.push_back({"layernorm" + path, r, mlp});
    r = {};
    r.moe_act = true;
    cases.push_back({"moe_act" + path, r, mlp});
    r = {};
    r.moe = true;
    cases.push_back({"moe" + path, r, mlp});
    r = {};
    r.core_attn = true;
    cases.push_back({"core_attn" + path, r, mlp});
    r.layernorm = true;
    r.moe = true;
    cases.push_back({"layernorm_moe_core_attn" + path, r, mlp});
    cases.push_back({"layernorm_moe_core_attn_in_layer_0" + path, r, mlp, /*num_layers=*/1});
    if (mlp == GroupedMlpKind::kFused) {
      cases.push_back({"qk_norm_layernorm_moe_core_attn" + path, r, mlp, -1, /*qk_norm=*/true});
    }
  }
  return cases;
}

// The shared tiny model (one dense layer, one MoE layer); on CUDA with head dim 64. With the
// query/key norm, a head dim of 12 (128 on CUDA) on 4 heads: q_dim 48 (512) beside hidden 32
// (256).
GptConfig Model(const Case& c) {
  GptConfig config = testing::TinyModel();
  if (kDevice.is_cuda()) config.hidden_size = 256;
  config.moe_grouped_mlp = c.mlp;
  if (c.qk_norm) {
    config.qk_layernorm = true;
    config.kv_channels = kDevice.is_cuda() ? 128 : 12;
  }
  return config;
}

GptConfig Recomputing(GptConfig config, const Case& c) {
  config.recompute = c.recompute;
  config.recompute_num_layers = c.num_layers;
  return config;
}

std::unique_ptr<TokenSource> Synthetic(int64_t vocab) {
  DataOptions data;
  data.vocab_size = vocab;
  return std::move(OpenTokenSource(data)).value();
}

std::unique_ptr<Trainer> NewTrainer(const GptConfig& config, const TokenSource* source,
                                    int64_t global_batch = 4) {
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = global_batch;
  o.train_steps = 100;
  o.warmup_steps = 2;
  o.eval_steps = 2;
  return std::move(Trainer::Create(config, o, kDevice, source)).value();
}

// What one forward on random tokens leaves saved: key -> bytes (the context is then backward'd).
std::map<std::string, int64_t> SavedAfterForward(const GptConfig& config) {
  ParameterSet parameters(kDevice, kCompute, 7, /*optimizer_state=*/false);
  GptModel model(config, parameters);
  const int64_t tokens = 2 * config.seq_length;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<int32_t> ids(tokens), targets(tokens);
  for (auto& v : ids) v = token(rng);
  for (auto& v : targets) v = token(rng);
  SavedTensors saved(/*training=*/true);
  model.Forward(saved, testing::FromInts(ids, {tokens}, kDevice),
                testing::FromInts(targets, {tokens}, kDevice),
                /*loss_grad=*/1.0f / static_cast<float>(tokens));
  std::map<std::string, int64_t> out;
  for (const std::string& key : saved.keys()) out[key] = saved.Peek(key).nbytes();
  model.Backward(saved, Tensor(), /*aux_grad=*/1.0f);
  EXPECT_TRUE(saved.empty()) << saved.keys().front();
  return out;
}

class RecomputeTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeTest, TrainingIsBitIdentical) {
  const Case& c = GetParam();
  GptConfig plain = Model(c);
  const GptConfig recomputed = Recomputing(plain, c);
  auto source = Synthetic(plain.vocab_size);
  auto reference = NewTrainer(plain, source.get());
  auto trainer = NewTrainer(recomputed, source.get());
  for (int step = 0; step < 3; ++step) {
    const StepStats want = reference->TrainStep();
    const StepStats got = trainer->TrainStep();
    EXPECT_EQ(got.loss, want.loss) << "step " << step;
    EXPECT_EQ(got.aux_loss, want.aux_loss) << "step " << step;
    EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << step;
  }
  for (size_t i = 0; i < reference->parameters().all().size(); ++i) {
    const Parameter& a = *reference->parameters().all()[i];
    EXPECT_EQ(testing::FloatBits(a.master),
              testing::FloatBits(trainer->parameters().all()[i]->master))
        << a.name;
  }
}

// Exactly the recomputed tensors are no longer kept (layer 0 is dense, layer 1 MoE).
TEST_P(RecomputeTest, KeepsExactlyWhatItDoesNotRecompute) {
  const Case& c = GetParam();
  GptConfig config = Model(c);
  const std::map<std::string, int64_t> plain = SavedAfterForward(config);
  const std::map<std::string, int64_t> kept = SavedAfterForward(Recomputing(config, c));

  std::set<std::string> want;
  for (const auto& [key, bytes] : plain) want.insert(key);
  const auto drop = [&](const std::string& key) {
    EXPECT_EQ(want.erase(key), 1u) << key << " was not saved without recompute";
  };
  const RecomputeModules r0 = Recomputing(config, c).recompute_in(0);  // the dense layer
  const RecomputeModules r1 = Recomputing(config, c).recompute_in(1);  // the MoE layer
  const bool fused = c.mlp == GroupedMlpKind::kFused;
  if (r1.moe) {
    for (const auto& [key, bytes] : plain) {
      if (key.starts_with("layers.1.moe.")) want.erase(key);
    }
    if (!r1.layernorm) want.insert("layers.1.moe.input");
  }
  if (r0.layernorm) {
    drop("layers.0.attention.x");
    drop("layers.0.mlp.x");
  }
  if (r1.layernorm) {
    drop("layers.1.attention.x");
    if (!r1.moe) drop("layers.1.moe.router.x");
  }
  for (const auto& [layer, r] : {std::pair{"layers.0", r0}, {"layers.1", r1}}) {
    if (!r.core_attn) continue;
    drop(std::string(layer) + ".attention.out");
    drop(std::string(layer) + ".attention.lse");
  }
  if (r1.moe_act && fused) drop("layers.1.moe.experts.a");  // unfused never keeps it
  std::set<std::string> got;
  for (const auto& [key, bytes] : kept) got.insert(key);
  EXPECT_EQ(got, want);
}

// The step's device peak falls by about the bytes no longer kept at the end of forward (the
// peak), less what one layer's recompute holds in backward.
TEST_P(RecomputeTest, DevicePeakFallsByTheBytesNotKept) {
  const Case& c = GetParam();
  GptConfig config = Model(c);
  config.num_layers = 4;
  config.first_dense_layers = 1;
  config.hidden_size = 256;
  config.moe_ffn_hidden_size = 256;  // the SwiGLU output alone is above the floor below in bf16
  config.seq_length = 128;
  config.vocab_size = 256;
  // In 4 layers, a case limited to layer 0 (dense) recomputes layers 0 and 1 (one dense, one MoE
  // layer) instead, so that what it drops is large enough to measure.
  Case limited = c;
  if (c.num_layers > 0) limited.num_layers = 2;
  const GptConfig recomputed = Recomputing(config, limited);
  int64_t not_kept = 0;
  {
    const std::map<std::string, int64_t> plain = SavedAfterForward(config);
    const std::map<std::string, int64_t> kept = SavedAfterForward(recomputed);
    for (const auto& [key, bytes] : plain) not_kept += bytes;
    for (const auto& [key, bytes] : kept) not_kept -= bytes;
  }
  auto source = Synthetic(config.vocab_size);
  auto plain = NewTrainer(config, source.get(), /*global_batch=*/2);
  auto trainer = NewTrainer(recomputed, source.get(), /*global_batch=*/2);
  CachingAllocator& allocator = DeviceContext::Get(kDevice).allocator();
  const auto step_peak = [&](Trainer& t) {
    const int64_t before = allocator.stats().allocated_bytes;
    allocator.ResetPeakStats();
    t.TrainStep();
    return allocator.stats().peak_allocated_bytes - before;
  };
  step_peak(*plain);  // first steps allocate the lazily created gradients and optimizer state
  step_peak(*trainer);
  const int64_t plain_peak = step_peak(*plain);
  const int64_t recompute_peak = step_peak(*trainer);
  if (c.recompute.moe_act && c.mlp == GroupedMlpKind::kUnfused) {
    EXPECT_EQ(not_kept, 0) << "the unfused path never keeps the SwiGLU output";
    EXPECT_EQ(recompute_peak, plain_peak);
    return;
  }
  ASSERT_GT(not_kept, 512 << 10) << "too small to be meaningful";
  const double fell = static_cast<double>(plain_peak - recompute_peak);
  EXPECT_GT(fell, 0.6 * not_kept) << "peak " << plain_peak << " -> " << recompute_peak;
  EXPECT_LE(fell, 1.05 * not_kept) << "peak " << plain_peak << " -> " << recompute_peak;
}

INSTANTIATE_TEST_SUITE_P(Modules, RecomputeTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe
