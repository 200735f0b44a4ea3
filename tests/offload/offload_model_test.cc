// Offloading on the whole model: losses and every gradient bit-identical to no offloading, from
// the first step and with slow copy streams; device peak memory lower by the bytes moved; exactly
// the selected groups' tensors move; evaluation between steps changes nothing; pinned memory does
// not grow.
//
// One source, two binaries (tests/CMakeLists.txt): offload_model_test on the CPU backend, where
// the copy streams are worker threads slowed down by the test latency knob, and with
// MOE_TEST_ON_CUDA offload_model_cuda_test on a GPU (bf16 activations; real copy engines, the knob
// has no effect there).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <set>

#include "engine/offload/offload_manager.h"
#include "engine/runtime/device_context.h"
#include "modules/gpt_model.h"
#include "modules/offload_groups.h"
#include "modules/trainer.h"
#include "tests/testing/copy_latency.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/test_device.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const Device kDevice = testing::kTestDevice;
constexpr DType kCompute = testing::kTestCompute;

// The shared tiny model; on CUDA with head dim 64, as the CUDA attention kernels take.
GptConfig TestModel() {
  GptConfig c = testing::TinyModel();
  if (kDevice.is_cuda()) c.hidden_size = 256;
  return c;
}

// With OLMoE's query/key norm (across heads) on a head dim other than hidden / heads: 12 (128 on
// CUDA) on 4 heads.
GptConfig QkNormModel() {
  GptConfig c = TestModel();
  c.qk_layernorm = c.qk_layernorm_across_heads = true;
  c.kv_channels = kDevice.is_cuda() ? 128 : 12;
  return c;
}

std::set<std::string> UnfusedGroups() {
  return {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"};
}

OffloadOptions Options(std::set<std::string> groups, int64_t min_bytes = 0) {
  OffloadOptions o;
  o.groups = std::move(groups);
  for (const std::string& g : RoutedOffloadGroups()) {
    if (o.groups.count(g)) o.unpooled_groups.insert(g);
  }
  o.min_tensor_bytes = min_bytes;
  return o;
}

TrainerOptions SmallOptions(std::optional<OffloadOptions> offload = std::nullopt) {
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 4;
  o.train_steps = 100;
  o.warmup_steps = 2;
  o.eval_steps = 2;
  o.offload = std::move(offload);
  return o;
}

std::unique_ptr<TokenSource> Synthetic(int64_t vocab) {
  DataOptions data;
  data.vocab_size = vocab;
  return std::move(OpenTokenSource(data)).value();
}

std::unique_ptr<Trainer> NewTrainer(const GptConfig& config, const TrainerOptions& options,
                                    const TokenSource* source) {
  return std::move(Trainer::Create(config, options, kDevice, source)).value();
}

// One forward and backward of the model on random tokens; returns the loss sum.
float MicroBatch(GptModel& model, uint32_t seed, OffloadManager* manager) {
  const GptConfig& c = model.config();
  const int64_t tokens = 2 * c.seq_length;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> ids(tokens), targets(tokens);
  for (auto& v : ids) v = token(rng);
  for (auto& v : targets) v = token(rng);
  SavedTensors saved(true, manager);
  const ForwardResult result = model.Forward(saved, testing::FromInts(ids, {tokens}, kDevice),
                                             testing::FromInts(targets, {tokens}, kDevice),
                                             /*loss_grad=*/1.0f / static_cast<float>(tokens));
  model.Backward(saved, Tensor(), /*aux_grad=*/1.0f);
  EXPECT_TRUE(saved.empty());
  return testing::ToFloats(result.loss_sum)[0];
}

// Every gradient of `config` with every unfused group offloaded, against none.
void ExpectBitIdenticalGradients(const GptConfig& config) {
  ParameterSet reference_parameters(kDevice, kCompute, 7, /*optimizer_state=*/false);
  ParameterSet offload_parameters(kDevice, kCompute, 7, /*optimizer_state=*/false);
  GptModel reference(config, reference_parameters);
  GptModel offloaded(config, offload_parameters);
  for (int prefetch : {0, 1}) {
    OffloadOptions options = Options(UnfusedGroups());
    options.prefetch_layers = prefetch;
    OffloadManager manager(kDevice, options);
    for (uint32_t step = 0; step < 3; ++step) {
      reference_parameters.ZeroGrads();
      offload_parameters.ZeroGrads();
      const float want = MicroBatch(reference, 100 + step, nullptr);
      const float got = MicroBatch(offloaded, 100 + step, &manager);
      EXPECT_EQ(std::memcmp(&want, &got, sizeof(float)), 0) << want << " vs " << got;
      const OffloadStepStats stats = manager.EndStep();
      EXPECT_GT(stats.offloaded_tensors, 20);
      EXPECT_EQ(stats.reloaded_bytes, stats.offloaded_bytes);
      for (size_t i = 0; i < reference_parameters.all().size(); ++i) {
        Parameter& a = *reference_parameters.all()[i];
        Parameter& b = *offload_parameters.all()[i];
        ASSERT_EQ(testing::FloatBits(MaterializedGrad(a)), testing::FloatBits(MaterializedGrad(b)))
            << a.name << " step " << step << " prefetch " << prefetch;
      }
    }
  }
}

// Every gradient, bit for bit, over several micro-batches (the first one included), with the
// copy streams slowed down so that a missing wait reads a buffer before its copy has landed.
TEST(OffloadModelTest, GradientsAreBitIdenticalWithSlowCopyStreams) {
  testing::LatencyKnob knob(std::chrono::microseconds(1500));
  for (const GptConfig& config : {TestModel(), QkNormModel()}) {
    SCOPED_TRACE(config.qk_layernorm ? "query/key norm" : "plain");
    ExpectBitIdenticalGradients(config);
  }
}

// The training loop: losses, gradient norms and the weights after several steps (which depend on
// every gradient), bit for bit; several micro-batches per step.
TEST(OffloadModelTest, TrainingIsBitIdentical) {
  testing::LatencyKnob knob(std::chrono::microseconds(500));
  auto source = Synthetic(64);
  OffloadOptions half = Options(UnfusedGroups());
  half.fraction = 0.5;
  half.prefetch_layers = 0;
  auto reference = NewTrainer(TestModel(), SmallOptions(), source.get());
  auto all = NewTrainer(TestModel(), SmallOptions(Options(UnfusedGroups())), source.get());
  auto some = NewTrainer(TestModel(), SmallOptions(half), source.get());
  for (int step = 0; step < 3; ++step) {
    const StepStats want = reference->TrainStep();
    for (Trainer* trainer : {all.get(), some.get()}) {
      const StepStats got = trainer->TrainStep();
      EXPECT_EQ(got.loss, want.loss) << "step " << step;
      EXPECT_EQ(got.aux_loss, want.aux_loss) << "step " << step;
      EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << step;
      EXPECT_GT(got.offload.offloaded_bytes, 0);
    }
  }
  for (Trainer* trainer : {all.get(), some.get()}) {
    for (size_t i = 0; i < reference->parameters().all().size(); ++i) {
      const Parameter& a = *reference->parameters().all()[i];
      EXPECT_EQ(testing::FloatBits(a.master),
                testing::FloatBits(trainer->parameters().all()[i]->master))
          << a.name;
    }
  }
}

// The keys moved by one configuration, in the warm-up step and the next one (the same).
std::set<std::string> MovedKeys(const std::set<std::string>& groups, int64_t min_bytes = 0,
                                const GptConfig& config = TestModel()) {
  ParameterSet parameters(kDevice, kCompute, 7, /*optimizer_state=*/false);
  GptModel model(config, parameters);
  OffloadManager manager(kDevice, Options(groups, min_bytes));
  std::set<std::string> first;
  for (uint32_t step = 0; step < 2; ++step) {
    MicroBatch(model, step, &manager);
    manager.EndStep();
    const auto& keys = manager.last_step_offloaded_keys();
    const std::set<std::string> moved(keys.begin(), keys.end());
    EXPECT_EQ(moved.size(), keys.size()) << "a key moved twice";
    if (step == 0) first = moved;
    EXPECT_EQ(moved, first) << "step " << step;
  }
  return first;
}

using Keys = std::set<std::string>;

TEST(OffloadModelTest, ExactlyTheSelectedGroupsMove) {
  EXPECT_EQ(MovedKeys({"attn_norm"}), (Keys{"layers.0.attn_norm.x", "layers.0.attn_norm.rstd",
                                            "layers.1.attn_norm.x", "layers.1.attn_norm.rstd"}));
  EXPECT_EQ(MovedKeys({"qkv_linear"}), (Keys{"layers.0.attention.x", "layers.1.attention.x"}));
  // With the query/key norm, qkv_linear also holds what the norms saved: q and k before them and
  // their rstd.
  Keys qkv_and_norms;
  for (int layer : {0, 1}) {
    for (const char* t : {"x", "q_norm.x", "q_norm.rstd", "k_norm.x", "k_norm.rstd"}) {
      qkv_and_norms.insert("layers." + std::to_string(layer) + ".attention." + t);
    }
  }
  EXPECT_EQ(MovedKeys({"qkv_linear"}, 0, QkNormModel()), qkv_and_norms);
  Keys core;
  for (int layer : {0, 1}) {
    for (const char* t : {"q", "k", "v", "lse"}) {
      core.insert("layers." + std::to_string(layer) + ".attention." + t);
    }
  }
  EXPECT_EQ(MovedKeys({"core_attn"}), core);
  Keys core_and_proj = core;
  core_and_proj.insert({"layers.0.attention.out", "layers.1.attention.out"});
  EXPECT_EQ(MovedKeys({"core_attn", "attn_proj"}), core_and_proj);
  EXPECT_EQ(MovedKeys({"mlp_norm"}), (Keys{"layers.0.mlp_norm.x", "layers.0.mlp_norm.rstd",
                                           "layers.1.mlp_norm.x", "layers.1.mlp_norm.rstd"}));
  // The expert groups exist in the MoE layer only; each moves its own inputs and nothing else.
  EXPECT_EQ(MovedKeys({"expert_fc1"}), (Keys{"layers.1.moe.experts.x"}));
  EXPECT_EQ(MovedKeys({"moe_act"}),
            (Keys{"layers.1.moe.experts.h", "layers.1.moe.experts.weights"}));
  EXPECT_EQ(
      MovedKeys({"expert_fc1", "moe_act"}),
      (Keys{"layers.1.moe.experts.x", "layers.1.moe.experts.h", "layers.1.moe.experts.weights"}));
  // The size threshold: the routing weights (rows x f32 = 256 bytes) stay, h (rows x 64 x f32)
  // moves.
  EXPECT_EQ(MovedKeys({"moe_act"}, /*min_bytes=*/1024), (Keys{"layers.1.moe.experts.h"}));
  Keys everything;
  for (const std::string& group : UnfusedGroups()) {
    const Keys keys = MovedKeys({group});
    everything.insert(keys.begin(), keys.end());
  }
  EXPECT_EQ(MovedKeys(UnfusedGroups()), everything);
  EXPECT_EQ(everything.size(), 4u + 2u + 8u + 2u + 4u + 3u);
}

TEST(OffloadModelTest, EveryUnfusedGroupNameIsOpenedByTheModel) {
  ParameterSet parameters(kDevice, kCompute, 7, /*optimizer_state=*/false);
  GptModel model(TestModel(), parameters);
  struct Recorder final : SavedTensorHooks {
    std::set<std::string> names;
    void OnCommit(SavedTensors&, const SavedGroup& group) override { names.insert(group.name); }
    void BeforeLoad(SavedTensors&, const SavedGroup*, const std::string&) override {}
  } recorder;
  {
    // Forward only through the recorder (no backward needed to see the commits).
    SavedTensors saved(true, &recorder);
    const int64_t tokens = model.config().seq_length;
    const Tensor ids = testing::FromInts(std::vector<int32_t>(tokens, 1), {tokens}, kDevice);
    model.Forward(saved, ids, ids, /*loss_grad=*/1.0f);
  }
  std::set<std::string> known(OffloadGroupNames().begin(), OffloadGroupNames().end());
  known.erase("fused_group_mlp");
  EXPECT_EQ(recorder.names, known);
}

// Device peak memory falls by the bytes the manager reports as moved. Half of the groups, the
// earliest, are offloaded (as the policy does), so their reloads come back only after the last
// layers' activations are gone and the peak stays where it was. (The margin covers the caching
// allocator handing out a cached block up to 1/8 larger than a request: blocks pending on a copy
// stream change which one a request gets.)
TEST(OffloadModelTest, DevicePeakMemoryFallsByTheOffloadedBytes) {
  GptConfig config = TestModel();  // 4 heads over 2 KV groups, 4 experts, top-2, unfused
  config.num_layers = 6;
  config.first_dense_layers = 0;
  config.hidden_size = 256;
  config.moe_ffn_hidden_size = 256;
  config.seq_length = 256;
  config.vocab_size = 256;
  TrainerOptions options = SmallOptions();
  options.global_batch_size = options.micro_batch_size;  // the peak is one micro-batch's
  OffloadOptions offload = Options(UnfusedGroups());
  offload.fraction = 0.5;
  auto source = Synthetic(256);
  auto plain = NewTrainer(config, options, source.get());
  options.offload = offload;
  auto offloaded = NewTrainer(config, options, source.get());

  CachingAllocator& allocator = DeviceContext::Get(kDevice).allocator();
  auto step_peak = [&](Trainer& trainer, StepStats* stats) {
    const int64_t before = allocator.stats().allocated_bytes;
    allocator.ResetPeakStats();
    *stats = trainer.TrainStep();
    return allocator.stats().peak_allocated_bytes - before;
  };
  StepStats plain_stats, offload_stats;
  for (int step = 0; step < 2; ++step) {  // the first is the warm-up
    const int64_t plain_peak = step_peak(*plain, &plain_stats);
    const int64_t offload_peak = step_peak(*offloaded, &offload_stats);
    EXPECT_EQ(plain_stats.loss, offload_stats.loss);
    if (step == 0) continue;
    const int64_t moved = offload_stats.offload.offloaded_bytes;
    EXPECT_GT(moved, 4 << 20) << "too small to be meaningful";
    const double saved = static_cast<double>(plain_peak - offload_peak);
    EXPECT_NEAR(saved, static_cast<double>(moved), std::max(0.1 * moved, 1024.0 * 1024.0))
        << "peak without " << plain_peak << ", with " << offload_peak << ", moved " << moved;
  }
  ASSERT_NE(offloaded->offload_manager(), nullptr);
  int offloaded_groups = 0, candidates = 0;
  for (const auto& s : offloaded->offload_manager()->summary()) {
    offloaded_groups += s.offloaded;
    candidates += s.candidates;
  }
  EXPECT_EQ(candidates, 6 * 7);
  EXPECT_EQ(offloaded_groups, 3 * 7) << "layers 0 to 2";
}

TEST(OffloadModelTest, EvaluationBetweenStepsChangesNothing) {
  auto source = Synthetic(64);
  const TrainerOptions options = SmallOptions(Options(UnfusedGroups()));
  auto a = NewTrainer(TestModel(), options, source.get());
  auto b = NewTrainer(TestModel(), options, source.get());
  a->Evaluate();  // before the warm-up step too
  for (int step = 0; step < 3; ++step) {
    const StepStats sa = a->TrainStep();
    const double eval = a->Evaluate();
    EXPECT_EQ(eval, a->Evaluate());
    const StepStats sb = b->TrainStep();
    EXPECT_EQ(sa.loss, sb.loss);
    EXPECT_EQ(sa.grad_norm, sb.grad_norm);
    EXPECT_EQ(sa.offload.offloaded_bytes, sb.offload.offloaded_bytes);
    EXPECT_EQ(sa.offload.offloaded_tensors, sb.offload.offloaded_tensors);
    EXPECT_EQ(sa.offload.reloaded_bytes, sb.offload.reloaded_bytes);
  }
  EXPECT_EQ(a->offload_manager()->SummaryTable(), b->offload_manager()->SummaryTable());
}

TEST(OffloadModelTest, PinnedAndDeviceMemoryDoNotGrowOver50Steps) {
  GptConfig config = TestModel();
  config.num_layers = 2;
  config.seq_length = 8;
  auto source = Synthetic(64);
  TrainerOptions options = SmallOptions(Options(UnfusedGroups()));
  options.global_batch_size = options.micro_batch_size;
  auto trainer = NewTrainer(config, options, source.get());
  PinnedHostPool& pool = DeviceContext::Get(kDevice).pinned_pool();
  CachingAllocator& allocator = DeviceContext::Get(kDevice).allocator();
  const PinnedPoolStats before = pool.stats();
  PinnedPoolStats after_warm_up;
  int64_t device_after_warm_up = 0, offloaded = 0;
  for (int step = 1; step <= 50; ++step) {
    offloaded += trainer->TrainStep().offload.offloaded_bytes;
    const PinnedPoolStats now = pool.stats();
    ASSERT_EQ(now.pooled_in_use_bytes, before.pooled_in_use_bytes) << "step " << step;
    ASSERT_EQ(now.unpooled_in_use_bytes, before.unpooled_in_use_bytes) << "step " << step;
    if (step == 2) {
      after_warm_up = now;
      device_after_warm_up = allocator.stats().allocated_bytes;
    }
    if (step > 2) {
      ASSERT_EQ(now.pooled_reserved_bytes, after_warm_up.pooled_reserved_bytes) << "step " << step;
      ASSERT_EQ(now.misses, after_warm_up.misses) << "step " << step;
      ASSERT_EQ(allocator.stats().allocated_bytes, device_after_warm_up) << "step " << step;
    }
  }
  const PinnedPoolStats end = pool.stats();
  EXPECT_GT(offloaded, 0);
  EXPECT_GE(end.hits - after_warm_up.hits, 48) << "static groups reuse pooled buffers";
  EXPECT_GE(end.unpooled_allocations - after_warm_up.unpooled_allocations, 48 * 2)
      << "routed groups bypass the pool";
}

}  // namespace
}  // namespace moe
