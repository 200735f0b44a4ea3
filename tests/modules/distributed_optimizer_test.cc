// The distributed optimizer in one process (tests/CMakeLists.txt compiles it twice: on the CPU,
// and with MOE_TEST_ON_CUDA on one GPU, bf16 values): with one data rank the flag is the
// degenerate case, its one shard the whole state, and training is bit-identical to plain; and
// the update of every shard of a sharded, bucketed state (each rank's OwnedSlices, here all in
// one process; a stack of parameters among them, updated as one slice) writes exactly the
// masters, moments and values that the whole update writes (elementwise arithmetic on aligned
// slices; the rest, reduce-scatter and all-gather, is trainer_parallel_mpi_test's).
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "engine/optim/adamw.h"
#include "modules/trainer.h"
#include "tests/testing/owned_slices.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/test_device.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const Device kDevice = testing::kTestDevice;

GptConfig Model() {
  GptConfig m = testing::TinyModel();
  if (kDevice.is_cuda()) m.hidden_size = 128;  // head dim 32 -> the CUDA attention's 64
  m.num_attention_heads = 2;
  m.num_query_groups = 1;
  return m;
}

struct TrainedRun {
  std::vector<StepStats> steps;
  std::map<std::string, std::vector<uint32_t>> masters, values;  // bits, by name
};

TrainedRun Train(bool distributed_optimizer) {
  DataOptions data;
  data.vocab_size = Model().vocab_size;
  const std::unique_ptr<TokenSource> source = std::move(OpenTokenSource(data)).value();
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 4;
  o.train_steps = 3;
  o.warmup_steps = 1;
  o.bucket_bytes = 16 << 10;
  o.use_distributed_optimizer = distributed_optimizer;
  auto trainer = std::move(Trainer::Create(Model(), o, kDevice, source.get())).value();
  TrainedRun run;
  for (int step = 0; step < 3; ++step) run.steps.push_back(trainer->TrainStep());
  for (const WholeParameterState& p : trainer->GatherWholeState()) {
    run.masters[p.name] = testing::FloatBits(p.master);
  }
  for (const auto& p : trainer->parameters().all()) {
    run.values[p->name] = testing::FloatBits(p->value);
  }
  return run;
}

TEST(DistributedOptimizerTest, WithOneDataRankTrainsBitIdenticallyToPlain) {
  const TrainedRun plain = Train(false);
  const TrainedRun flagged = Train(true);
  for (size_t step = 0; step < plain.steps.size(); ++step) {
    EXPECT_EQ(flagged.steps[step].loss, plain.steps[step].loss) << "step " << step;
    EXPECT_EQ(flagged.steps[step].grad_norm, plain.steps[step].grad_norm) << "step " << step;
  }
  EXPECT_FALSE(plain.masters.empty());
  EXPECT_EQ(flagged.masters, plain.masters);
  EXPECT_EQ(flagged.values, plain.values);
}

// Parameters of awkward sizes over a few buckets, the last three a stack (e.k starts 287
// elements into it, not 16-byte aligned).
std::vector<ParameterSpec> Specs() {
  return {{"a.weight", {37, 19}},
          {"a.norm", {19}, Init::kOnes, 0.02f, /*weight_decay=*/false},
          {"b.weight", {3, 500}},
          {"c.weight", {1000}},
          {"d.norm", {7}, Init::kOnes, 0.02f, /*weight_decay=*/false},
          {"e.q", {41, 7}},
          {"e.k", {20, 7}},
          {"e.v", {20, 7}}};
}
constexpr size_t kStackBegin = 5;

void CreateParameters(ParameterSet& set) {
  const std::vector<ParameterSpec> specs = Specs();
  for (size_t i = 0; i < kStackBegin; ++i) set.Create(specs[i]);
  set.CreateStack(std::span(specs).subspan(kStackBegin));
}

// Gradient element i of parameter `name`, the same in every set.
std::vector<float> Grad(const std::string& name, int64_t n) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = 0.01f * static_cast<float>((i * 7 + static_cast<int64_t>(name.size())) % 23) - 0.1f;
  }
  return g;
}

void SetGrads(ParameterSet& set) {
  for (const auto& p : set.all()) {
    BeginGradWrite(*p);
    ops::Cast(
        testing::FromFloats(Grad(p->name, p->grad.numel()), p->grad.shape(), DType::kF32, kDevice),
        p->grad);
  }
}

void ExpectShardsUpdateAsTheWhole(const OptimizerDTypes& optimizer_dtypes) {
  constexpr int kShards = 3;
  constexpr int64_t kBucketBytes = 1200 * 4;  // {a.weight, a.norm}, {b}, {c}, {d, e}
  ops::AdamWConfig config;
  config.lr = 1e-2f;
  config.weight_decay = 0.1f;
  config.step = 1;
  ParameterSet whole =
      ParameterSet::Deferred(kDevice, testing::kTestCompute, /*seed=*/9, optimizer_dtypes);
  CreateParameters(whole);
  whole.AllocateBuckets(/*sharding=*/{}, kBucketBytes);
  SetGrads(whole);
  ops::AdamWUpdate(AdamWUpdateEntries(whole.OwnedSlices()), config);

  std::map<std::string, std::vector<int>> covered;  // elements updated, by parameter
  for (int shard = 0; shard < kShards; ++shard) {
    ParameterSet set =
        ParameterSet::Deferred(kDevice, testing::kTestCompute, /*seed=*/9, optimizer_dtypes);
    CreateParameters(set);
    set.AllocateBuckets({.data = {kShards, shard}}, kBucketBytes);
    ASSERT_EQ(set.buckets().size(), 4u);
    SetGrads(set);
    const std::vector<OwnedSlice> slices = set.OwnedSlices();
    ops::AdamWUpdate(AdamWUpdateEntries(slices), config);
    for (const OwnedSlice& s : slices) {
      EXPECT_EQ(s.exp_avg.dtype(), optimizer_dtypes.exp_avg);
      for (const testing::SlicePart& part : testing::SliceParts(set, s)) {
        const std::string& name = part.parameter->name;
        const Parameter& want = whole.Get(name);
        // Elements [first, first + part.count) of t's bits.
        const auto bits = [&](const Tensor& t, int64_t first) {
          const std::vector<uint32_t> all = testing::FloatBits(t);
          return std::vector<uint32_t>(all.begin() + first, all.begin() + first + part.count);
        };
        EXPECT_EQ(bits(s.master, part.at), bits(want.master, part.first)) << name;
        EXPECT_EQ(bits(s.exp_avg, part.at), bits(want.exp_avg, part.first)) << name;
        EXPECT_EQ(bits(s.exp_avg_sq, part.at), bits(want.exp_avg_sq, part.first)) << name;
        EXPECT_EQ(bits(s.value, part.at), bits(want.value, part.first)) << name;
        std::vector<int>& counts = covered[name];
        counts.resize(want.value.numel(), 0);
        for (int64_t i = part.first; i < part.first + part.count; ++i) ++counts[i];
      }
    }
  }
  ASSERT_EQ(covered.size(), Specs().size());
  for (const auto& [name, counts] : covered) {
    for (size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], 1) << name << "[" << i << "]";
  }
}

// With f32 and with bf16 moments, and bf16 gradients.
TEST(DistributedOptimizerTest, TheShardsUpdatesAreTheWholeUpdate) {
  for (const auto& [grad, moments] :
       {std::pair{DType::kF32, DType::kF32}, std::pair{DType::kF32, DType::kBF16},
        std::pair{DType::kBF16, DType::kBF16}}) {
    SCOPED_TRACE(DTypeName(grad) + std::string(" gradients, ") + DTypeName(moments) + " moments");
    ExpectShardsUpdateAsTheWhole(OptimizerDTypes{grad, moments, moments});
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace moe
