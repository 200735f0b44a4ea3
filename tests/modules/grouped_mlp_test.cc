// The fused and the unfused grouped MLP on the CPU (f32): the same function and gradients to fp32
// rounding on routings with empty experts, all rows on one expert and heavy imbalance; the
// saved-tensor groups each registers for offloading; and a whole tiny model trains to the same
// loss curve on either path. The fused path's weight gradients once per several micro-batches:
// the same bits as one pass per micro-batch (the module, the trainer, under offloading), the
// gradients unwritten until the pass.
#include "modules/grouped_mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "modules/offload_groups.h"
#include "modules/trainer.h"
#include "tests/testing/copy_latency.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

using testing::RelativeError;
using testing::ToFloats;

constexpr double kFp32Rounding = 1e-6;
constexpr int kLayer = 3;

GptConfig MlpConfig() {
  GptConfig c;
  c.hidden_size = 24;
  c.num_experts = 6;
  c.moe_ffn_hidden_size = 20;
  c.init_std = 0.2f;
  return c;
}

// Offsets for expert row counts.
std::vector<int32_t> OffsetsOf(const std::vector<int32_t>& counts) {
  std::vector<int32_t> offsets = {0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  return offsets;
}

struct Routing {
  std::string name;
  std::vector<int32_t> counts;  // rows per expert
};

// Random counts over `experts` where about half the experts get no rows.
std::vector<int32_t> RandomCounts(int64_t experts, std::mt19937& rng) {
  std::vector<int32_t> counts(experts);
  std::uniform_int_distribution<int32_t> rows(1, 12), coin(0, 1);
  for (int32_t& c : counts) c = coin(rng) ? rows(rng) : 0;
  counts[rng() % experts] += 1;  // never all empty
  return counts;
}

std::vector<Routing> Routings(std::mt19937& rng) {
  return {{"random with empty experts", RandomCounts(6, rng)},
          {"all rows on one expert", {0, 0, 0, 37, 0, 0}},
          {"heavy imbalance", {1, 60, 0, 2, 1, 0}},
          {"every expert", {5, 3, 8, 2, 7, 4}}};
}

// One forward and backward of a grouped MLP, everything it produced read back.
struct PathRun {
  std::vector<float> y, dx, dweights, fc1_grad, fc2_grad;
  std::vector<SavedGroup> groups;
  std::vector<std::string> keys;  // saved after forward
};

// x and dy hold the rows themselves, or with `index` the tokens whose rows index[r] they are
// (PermutedRows: read in place).
PathRun RunPath(GroupedMlpKind kind, const GptConfig& base, const std::vector<int32_t>& offsets,
                const std::vector<float>& x, const std::vector<float>& weights,
                const std::vector<float>& dy, const std::vector<int32_t>& index = {}) {
  GptConfig config = base;
  config.moe_grouped_mlp = kind;
  ParameterSet parameters(Device::CPU(), DType::kF32, /*seed=*/7);
  std::unique_ptr<GroupedMlp> mlp = MakeGroupedMlp(parameters, "experts", config, kLayer);
  const int64_t rows = offsets.back(), hidden = config.hidden_size;
  const int64_t x_rows = static_cast<int64_t>(x.size()) / hidden;
  const Device cpu = Device::CPU();
  const auto rows_of = [&](const std::vector<float>& values) {
    const Tensor t = testing::FromFloats(values, {x_rows, hidden}, DType::kF32, cpu);
    if (index.empty()) return PermutedRows(t);
    return PermutedRows(t, testing::FromInts(index, {rows}, cpu));
  };
  SavedTensors saved;
  const Tensor y =
      mlp->Forward(saved, rows_of(x), testing::FromInts(offsets, {config.num_experts + 1}, cpu),
                   testing::FromFloats(weights, {rows}, DType::kF32, cpu));
  PathRun run;
  run.groups = saved.groups();
  run.keys = saved.keys();
  parameters.ZeroGrads();
  const GroupedMlp::Grads grads = mlp->Backward(saved, rows_of(dy), /*last_of_step=*/true);
  EXPECT_TRUE(saved.empty()) << "backward left saved tensors";
  run.y = ToFloats(y);
  run.dx = ToFloats(grads.dx);
  run.dweights = ToFloats(grads.dweights);
  run.fc1_grad = ToFloats(MaterializedGrad(parameters.Get("experts.fc1.weight")));
  run.fc2_grad = ToFloats(MaterializedGrad(parameters.Get("experts.fc2.weight")));
  return run;
}

// Rows read in place through the MoE layer's permutation (PermutedRows with an index, the FP8
// recipe quantising them where they lie) give exactly what the gathered rows give, on every path.
TEST(GroupedMlpTest, PermutedRowsReadInPlaceGiveExactlyTheGatheredRowsResults) {
  GptConfig config = MlpConfig();
  config.hidden_size = 32;  // the FP8 recipe's multiples of 16
  config.moe_ffn_hidden_size = 16;
  std::mt19937 rng(testing::TestSeed());
  const std::vector<int32_t> offsets = OffsetsOf({5, 0, 9, 2, 0, 6});
  const int64_t rows = offsets.back(), tokens = 15, hidden = config.hidden_size;
  std::vector<int32_t> index(rows);
  for (int32_t& i : index) i = static_cast<int32_t>(rng() % tokens);
  const std::vector<float> x = testing::RandomFloats(tokens * hidden, rng);
  const std::vector<float> dy = testing::RandomFloats(tokens * hidden, rng);
  const auto gathered = [&](const std::vector<float>& values) {
    std::vector<float> out;
    for (const int32_t i : index) {
      out.insert(out.end(), values.begin() + i * hidden, values.begin() + (i + 1) * hidden);
    }
    return out;
  };
  std::vector<float> weights = testing::RandomFloats(rows, rng);
  for (float& w : weights) w = std::abs(w) + 0.05f;
  for (const auto& [kind, fp8] : {std::pair{GroupedMlpKind::kUnfused, Fp8Recipe::kNone},
                                  std::pair{GroupedMlpKind::kFused, Fp8Recipe::kNone},
                                  std::pair{GroupedMlpKind::kFused, Fp8Recipe::kBlockwise}}) {
    config.fp8_recipe = fp8;
    SCOPED_TRACE(std::string(kind == GroupedMlpKind::kFused ? "fused" : "unfused") +
                 (fp8 == Fp8Recipe::kBlockwise ? " fp8" : ""));
    const PathRun in_place = RunPath(kind, config, offsets, x, weights, dy, index);
    const PathRun gathered_run = RunPath(kind, config, offsets, gathered(x), weights, gathered(dy));
    EXPECT_EQ(in_place.y, gathered_run.y) << "y";
    EXPECT_EQ(in_place.dx, gathered_run.dx) << "dx";
    EXPECT_EQ(in_place.dweights, gathered_run.dweights) << "dweights";
    EXPECT_EQ(in_place.fc1_grad, gathered_run.fc1_grad) << "fc1_grad";
    EXPECT_EQ(in_place.fc2_grad, gathered_run.fc2_grad) << "fc2_grad";
  }
}

TEST(GroupedMlpTest, FusedMatchesUnfusedToFp32Rounding) {
  const GptConfig config = MlpConfig();
  std::mt19937 rng(testing::TestSeed());
  SCOPED_TRACE("seed " + std::to_string(testing::TestSeed()));
  for (const Routing& routing : Routings(rng)) {
    SCOPED_TRACE(routing.name);
    const std::vector<int32_t> offsets = OffsetsOf(routing.counts);
    const int64_t rows = offsets.back();
    const std::vector<float> x = testing::RandomFloats(rows * config.hidden_size, rng);
    const std::vector<float> dy = testing::RandomFloats(rows * config.hidden_size, rng);
    std::vector<float> weights = testing::RandomFloats(rows, rng);
    for (float& w : weights) w = std::abs(w) + 0.05f;
    const PathRun unfused = RunPath(GroupedMlpKind::kUnfused, config, offsets, x, weights, dy);
    const PathRun fused = RunPath(GroupedMlpKind::kFused, config, offsets, x, weights, dy);
    EXPECT_LE(RelativeError(fused.y, unfused.y), kFp32Rounding) << "y";
    EXPECT_LE(RelativeError(fused.dx, unfused.dx), kFp32Rounding) << "dx";
    EXPECT_LE(RelativeError(fused.dweights, unfused.dweights), kFp32Rounding) << "dweights";
    EXPECT_LE(RelativeError(fused.fc1_grad, unfused.fc1_grad), kFp32Rounding) << "fc1 grad";
    EXPECT_LE(RelativeError(fused.fc2_grad, unfused.fc2_grad), kFp32Rounding) << "fc2 grad";
  }
}

void ExpectGroup(const SavedGroup& group, const std::string& name,
                 const std::vector<std::string>& keys) {
  EXPECT_EQ(group.name, name);
  EXPECT_EQ(group.layer, kLayer) << name;
  EXPECT_EQ(group.keys, keys) << name;
  EXPECT_TRUE(group.committed) << name;
}

TEST(GroupedMlpTest, EachPathSavesItsOffloadGroups) {
  const GptConfig config = MlpConfig();
  std::mt19937 rng(testing::TestSeed());
  const std::vector<int32_t> offsets = OffsetsOf({4, 0, 9, 1, 0, 6});
  const int64_t rows = offsets.back();
  const std::vector<float> x = testing::RandomFloats(rows * config.hidden_size, rng);
  const std::vector<float> weights(rows, 0.5f);

  const PathRun unfused = RunPath(GroupedMlpKind::kUnfused, config, offsets, x, weights, x);
  ASSERT_EQ(unfused.groups.size(), 2u);
  ExpectGroup(unfused.groups[0], "expert_fc1", {"experts.x"});
  ExpectGroup(unfused.groups[1], "moe_act", {"experts.h", "experts.weights"});
  EXPECT_EQ(unfused.keys, (std::vector<std::string>{"experts.h", "experts.offsets",
                                                    "experts.weights", "experts.x"}));

  // The fused path keeps the routing weights and the offsets outside its group (and no host copy
  // of them: on the CPU its grouped GEMMs read the offsets tensor itself).
  const PathRun fused = RunPath(GroupedMlpKind::kFused, config, offsets, x, weights, x);
  ASSERT_EQ(fused.groups.size(), 1u);
  ExpectGroup(fused.groups[0], "fused_group_mlp", {"experts.x", "experts.h", "experts.a"});
  EXPECT_EQ(fused.keys, (std::vector<std::string>{"experts.a", "experts.h", "experts.offsets",
                                                  "experts.weights", "experts.x"}));
}

// Three micro-batches (different routings) through the fused path with weight gradients once per
// `wgrad_micro_batches`; the last backward is the step's last. Per micro-batch: whether the
// expert gradients were still unwritten after its backward.
struct MicroBatchesRun {
  std::vector<float> fc1_grad, fc2_grad, dx;  // dx of every micro-batch, concatenated
  std::vector<bool> unwritten_after;
};

MicroBatchesRun RunMicroBatches(int64_t wgrad_micro_batches, uint32_t seed) {
  GptConfig config = MlpConfig();
  config.moe_wgrad_micro_batches = wgrad_micro_batches;
  ParameterSet parameters(Device::CPU(), DType::kF32, /*seed=*/7);
  std::unique_ptr<GroupedMlp> mlp = MakeGroupedMlp(parameters, "experts", config, kLayer);
  Parameter& fc1 = parameters.Get("experts.fc1.weight");
  std::mt19937 rng(seed);
  const std::vector<std::vector<int32_t>> counts = {
      RandomCounts(config.num_experts, rng), {0, 0, 0, 37, 0, 0}, {5, 3, 8, 2, 7, 4}};
  const Device cpu = Device::CPU();
  parameters.ZeroGrads();
  MicroBatchesRun run;
  for (size_t m = 0; m < counts.size(); ++m) {
    const std::vector<int32_t> offsets = OffsetsOf(counts[m]);
    const int64_t rows = offsets.back(), hidden = config.hidden_size;
    std::vector<float> weights = testing::RandomFloats(rows, rng);
    for (float& w : weights) w = std::abs(w) + 0.05f;
    SavedTensors saved;
    mlp->Forward(saved,
                 testing::FromFloats(testing::RandomFloats(rows * hidden, rng), {rows, hidden},
                                     DType::kF32, cpu),
                 testing::FromInts(offsets, {config.num_experts + 1}, cpu),
                 testing::FromFloats(weights, {rows}, DType::kF32, cpu));
    const GroupedMlp::Grads grads =
        mlp->Backward(saved,
                      testing::FromFloats(testing::RandomFloats(rows * hidden, rng), {rows, hidden},
                                          DType::kF32, cpu),
                      /*last_of_step=*/m + 1 == counts.size());
    const std::vector<float> dx = ToFloats(grads.dx);
    run.dx.insert(run.dx.end(), dx.begin(), dx.end());
    run.unwritten_after.push_back(fc1.grad_pending_zero);
  }
  run.fc1_grad = ToFloats(MaterializedGrad(fc1));
  run.fc2_grad = ToFloats(MaterializedGrad(parameters.Get("experts.fc2.weight")));
  return run;
}

// The CPU adds the parts one by one, as one call per micro-batch would: the same bits. What
// changes is when: after the first backward the gradients are still unwritten, and the step's
// last backward adds whatever is pending even short of the count.
TEST(GroupedMlpTest, FusedAddsWeightGradsOncePerMoeWgradMicroBatches) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MicroBatchesRun each = RunMicroBatches(1, seed);
  EXPECT_EQ(each.unwritten_after, (std::vector<bool>{false, false, false}));
  for (const int64_t n : {2, 3, 4}) {
    SCOPED_TRACE("once per " + std::to_string(n));
    const MicroBatchesRun grouped = RunMicroBatches(n, seed);
    EXPECT_EQ(grouped.fc1_grad, each.fc1_grad);
    EXPECT_EQ(grouped.fc2_grad, each.fc2_grad);
    EXPECT_EQ(grouped.dx, each.dx);
    EXPECT_EQ(grouped.unwritten_after, (std::vector<bool>{true, n > 2, false}));
  }
}

// The loss of each of `steps` steps of `config` on the CPU, global batch 8 of micro-batches of
// micro_batch_size sequences; with `offload`, the bytes offloaded over the run go to *offloaded.
std::vector<double> TinyLossCurve(const GptConfig& config, int64_t micro_batch_size, int steps,
                                  std::optional<OffloadOptions> offload = std::nullopt,
                                  int64_t* offloaded = nullptr) {
  TrainerOptions options;
  options.offload = std::move(offload);
  options.micro_batch_size = micro_batch_size;
  options.global_batch_size = 8;
  options.train_steps = steps;
  options.warmup_steps = 3;
  options.lr = 1e-2f;
  options.min_lr = 1e-3f;
  DataOptions data;
  data.vocab_size = config.vocab_size;
  const std::unique_ptr<TokenSource> source = std::move(OpenTokenSource(data)).value();
  auto trainer = std::move(Trainer::Create(config, options, Device::CPU(), source.get())).value();
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const StepStats stats = trainer->TrainStep();
    losses.push_back(stats.loss);
    if (offloaded != nullptr) *offloaded += stats.offload.offloaded_bytes;
  }
  return losses;
}

// The same through the trainer: the pipeline executor tells the layers which backward is the
// step's last (4 micro-batches a step: with 3, one pass adds three and the last adds one).
TEST(GroupedMlpTest, TinyModelTrainsBitIdenticallyWithWeightGradsOncePerMicroBatches) {
  GptConfig config = testing::TinyModel();
  config.moe_grouped_mlp = GroupedMlpKind::kFused;
  const std::vector<double> each = TinyLossCurve(config, 2, 4);
  for (const int64_t n : {2, 3}) {
    config.moe_wgrad_micro_batches = n;
    EXPECT_EQ(TinyLossCurve(config, 2, 4), each) << "once per " << n;
  }
}

// Offloading every group (copies slowed down, so reloads land late) while the layers hold earlier
// micro-batches' reloaded operands for a later pass changes no bit.
TEST(GroupedMlpTest, WeightGradsOncePerMicroBatchesUnderOffloadingChangeNoBit) {
  GptConfig config = testing::TinyModel();
  config.moe_grouped_mlp = GroupedMlpKind::kFused;
  config.moe_wgrad_micro_batches = 3;
  const testing::LatencyKnob slow_copies(std::chrono::microseconds(300));
  OffloadOptions offload;
  offload.groups = EligibleOffloadGroups(config.moe_grouped_mlp);
  for (const std::string& g : RoutedOffloadGroups()) {
    if (offload.groups.count(g)) offload.unpooled_groups.insert(g);
  }
  offload.min_tensor_bytes = 0;
  int64_t offloaded = 0;
  EXPECT_EQ(TinyLossCurve(config, 2, 4, offload, &offloaded), TinyLossCurve(config, 2, 4));
  EXPECT_GT(offloaded, 0);
}

TEST(GroupedMlpTest, TinyModelTrainsToTheSameLossCurveOnEitherPath) {
  GptConfig config = testing::TinyModel();
  constexpr int kSteps = 20;
  const auto loss_curve = [&](GroupedMlpKind kind) {
    config.moe_grouped_mlp = kind;
    return TinyLossCurve(config, 4, kSteps);
  };
  const std::vector<double> unfused = loss_curve(GroupedMlpKind::kUnfused);
  const std::vector<double> fused = loss_curve(GroupedMlpKind::kFused);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(fused[step], unfused[step], 1e-4 * unfused[step]) << "step " << step;
  }
  EXPECT_LT(fused.back(), fused.front()) << "the loss did not fall";
}

}  // namespace
}  // namespace moe
