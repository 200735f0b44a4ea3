// The memory estimate moe_train checks at start (modules/memory_estimate.h): its parameter count
// is the model's, its state bytes are the trainer's (one shard of the masters and moments under
// the distributed optimizer; a rank's share of the experts and of their state under expert
// parallelism, their rows with the margin; under mpirun: expert_memory_mpi_test), on real CPU runs
// (with and without recompute) it is an upper bound of the measured peak that is not far off
// (within 2x), and recompute lowers only the activations.
#include "modules/memory_estimate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/runtime/device_context.h"
#include "modules/trainer.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

// moe_train's default model with Qwen3's query/key norm on a head dim other than hidden / heads
// (96 on 2 heads: q_dim 192 beside hidden 128).
GptConfig QkNormModel() {
  GptConfig m = testing::DefaultRunModel();
  m.kv_channels = 96;
  m.qk_layernorm = true;
  return m;
}

TEST(MemoryEstimateTest, CountsTheModelsParametersAndTheTrainersState) {
  for (const GptConfig& m : {testing::TinyModel(), testing::DefaultRunModel(), QkNormModel()}) {
    MemoryEstimateOptions o;
    o.model = m;
    const MemoryEstimate e = EstimateTrainingMemory(o);
    EXPECT_EQ(e.parameters, static_cast<double>(m.total_parameters()));
    EXPECT_EQ(e.state_bytes, 16.0 * m.total_parameters());
    o.cuda = true;
    EXPECT_EQ(EstimateTrainingMemory(o).state_bytes, 18.0 * m.total_parameters());
  }
}

// Under the distributed optimizer a rank counts its shard of the masters (CUDA) and moments.
TEST(MemoryEstimateTest, ShardedStateCountsOneShardOfTheMastersAndMoments) {
  const OptimizerDTypes f32;
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 1, f32), 18.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/false, 1, f32), 16.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 4, f32), 9.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/false, 2, f32), 12.0);
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.cuda = true;
  o.state_shards = 8;
  const MemoryEstimate sharded = EstimateTrainingMemory(o);
  EXPECT_EQ(sharded.state_bytes, 7.5 * o.model.total_parameters());
  o.state_shards = 1;
  EXPECT_EQ(EstimateTrainingMemory(o).activation_bytes, sharded.activation_bytes);
}

// Expert parallelism over E ranks: the default model's one MoE layer holds 4 x 3 x 128 x 128 expert
// parameters, 1 / E of them on a rank; their master and moments are sharded over the expert-data
// group (8 / E ranks), the others' over the data group (8); on the CPU their gradients also have E
// source slots. The grouped MLP's saves (fused: each row's input, fc1 output, activation in bf16
// and its f32 weight, 2 x (128 + 256 + 128) + 4 bytes) count kExpertRowsMargin times the
// micro-batch's routed rows (rounded up), and its device offsets one set per source rank.
TEST(MemoryEstimateTest, ExpertParallelCountsTheRanksExpertsAndTheirRowsWithTheMargin) {
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.micro_batch_size = 4;
  o.micro_batches = 4;
  o.cuda = true;
  o.state_shards = 8;
  const double experts = 4.0 * 3 * 128 * 128;
  const double dense = static_cast<double>(o.model.total_parameters()) - experts;
  const double rows = 4.0 * 64 * 2;
  const MemoryEstimate whole = EstimateTrainingMemory(o);
  EXPECT_EQ(whole.state_bytes, 7.5 * (dense + experts));
  for (const int64_t e : {2, 4}) {
    SCOPED_TRACE("expert parallel " + std::to_string(e));
    o.expert_parallel = e;
    const MemoryEstimate split = EstimateTrainingMemory(o);
    const double local = experts / static_cast<double>(e);
    EXPECT_EQ(split.parameters, dense + local);
    // 2 + 4 + 12 / shards: 7.5 over the data group, over the expert-data group 2 + 4 + 12 / (8 /
    // E).
    EXPECT_EQ(split.state_bytes, 7.5 * dense + (6 + 12.0 / static_cast<double>(8 / e)) * local);
    const double extra_rows = ExpertRows(o.model, 4, e) - rows;
    // In each of the 2 layers (each counted as the larger kind, the MoE layer's).
    EXPECT_DOUBLE_EQ(
        split.activation_bytes - whole.activation_bytes,
        2 * (extra_rows * (2 * (128 + 256 + 128) + 4) + static_cast<double>(e - 1) * 4));
    EXPECT_GT(split.workspace_bytes, whole.workspace_bytes);  // one layer's backward: its saves
  }
  o.cuda = false;
  o.state_shards = 1;
  o.expert_parallel = 2;
  // CPU, f32: 16 bytes per parameter, the experts' gradient slots 2 x 4 more.
  EXPECT_EQ(EstimateTrainingMemory(o).state_bytes, 16 * dense + (16 + 2 * 4) * experts / 2);
  EXPECT_EQ(ExpertRows(o.model, 4, 1), rows);
  EXPECT_EQ(ExpertRows(o.model, 4, 2), std::ceil(kExpertRowsMargin * rows));
}

// bf16 moments take 2 + 2 bytes instead of 4 + 4, sharded or not; a bf16 gradient 2 instead of 4
// (never sharded).
TEST(MemoryEstimateTest, Bf16MomentsAndGradientsCountTwoBytesEach) {
  const OptimizerDTypes bf16_moments{DType::kF32, DType::kBF16, DType::kBF16};
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 1, bf16_moments), 14.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/false, 1, bf16_moments), 12.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 4, bf16_moments), 8.0);
  const OptimizerDTypes one_of_each{DType::kF32, DType::kF32, DType::kBF16};
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 1, one_of_each), 16.0);
  const OptimizerDTypes all_bf16{DType::kBF16, DType::kBF16, DType::kBF16};
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 1, all_bf16), 12.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/true, 4, all_bf16), 6.0);
  EXPECT_EQ(StateBytesPerParameter(/*cuda=*/false, 2, all_bf16), 8.0);
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.cuda = true;
  const MemoryEstimate f32 = EstimateTrainingMemory(o);
  o.dtypes = bf16_moments;
  const MemoryEstimate bf16 = EstimateTrainingMemory(o);
  EXPECT_EQ(f32.state_bytes - bf16.state_bytes, 4.0 * o.model.total_parameters());
  EXPECT_EQ(f32.activation_bytes, bf16.activation_bytes);
  o.dtypes = all_bf16;
  EXPECT_EQ(f32.state_bytes - EstimateTrainingMemory(o).state_bytes,
            6.0 * o.model.total_parameters());
}

// The FP8 recipe adds its quantised expert weights, both orientations (1 byte each) with one f32
// scale per 128 x 128 block, to the state, and takes nothing from the optimizer's.
TEST(MemoryEstimateTest, Fp8RecipeAddsTheQuantisedExpertWeights) {
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.model.moe_grouped_mlp = GroupedMlpKind::kFused;
  o.cuda = true;
  const RankParameters p = LayerParameters(o, /*moe_layer=*/true);
  const StateBytes bf16 = RankStateBytes(o, p);
  const double bf16_total = EstimateTrainingMemory(o).state_bytes;
  o.model.fp8_recipe = Fp8Recipe::kBlockwise;
  const StateBytes fp8 = RankStateBytes(o, p);
  const double quantised = p.expert * (2.0 + 2.0 * 4 / (128 * 128));
  EXPECT_DOUBLE_EQ(fp8.weights - bf16.weights, quantised);
  EXPECT_EQ(fp8.gradients, bf16.gradients);
  EXPECT_EQ(fp8.optimizer, bf16.optimizer);
  EXPECT_DOUBLE_EQ(EstimateTrainingMemory(o).state_bytes - bf16_total,
                   o.model.num_moe_layers() * quantised);
}

TEST(MemoryEstimateTest, GrowsWithTheRunAndShrinksPerRankWithAPipeline) {
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.model.num_layers = 8;
  o.micro_batch_size = 8;
  const MemoryEstimate base = EstimateTrainingMemory(o);
  MemoryEstimateOptions longer = o;
  longer.model.seq_length *= 4;
  EXPECT_GT(EstimateTrainingMemory(longer).activation_bytes, 3.9 * base.activation_bytes);
  MemoryEstimateOptions piped = o;
  piped.pipeline_parallel = 4;
  piped.micro_batches = 8;
  const MemoryEstimate per_rank = EstimateTrainingMemory(piped);
  EXPECT_LT(per_rank.state_bytes, base.state_bytes);
  // 1F1B's first rank holds min(p, m) = 4 micro-batches of its 2 layers: 8 layer passes, as many
  // as one process holds for its 8 layers.
  EXPECT_NEAR(per_rank.activation_bytes, base.activation_bytes, 1e-6 * base.activation_bytes);
  // Absurd sizes stay finite (doubles, no int64 overflow).
  MemoryEstimateOptions huge = o;
  huge.model.num_layers = 1 << 20;
  huge.model.hidden_size = 1 << 20;
  huge.model.moe_ffn_hidden_size = 1 << 24;
  huge.model.num_experts = 1 << 16;
  EXPECT_TRUE(std::isfinite(EstimateTrainingMemory(huge).total_bytes));
  EXPECT_GT(EstimateTrainingMemory(huge).total_bytes, 1e24);
}

// Trains two steps on the CPU and compares the allocator's peak with the estimate.
double MeasuredPeakBytes(const GptConfig& model, const TrainerOptions& options) {
  DataOptions data;
  data.vocab_size = model.vocab_size;
  const std::unique_ptr<TokenSource> source = std::move(OpenTokenSource(data)).value();
  CachingAllocator& allocator = DeviceContext::Get(Device::CPU()).allocator();
  allocator.EmptyCache();
  allocator.ResetPeakStats();
  const double before = static_cast<double>(allocator.stats().allocated_bytes);
  {
    auto trainer = std::move(Trainer::Create(model, options, Device::CPU(), source.get())).value();
    trainer->TrainStep();
    trainer->TrainStep();
  }
  return static_cast<double>(allocator.stats().peak_allocated_bytes) - before;
}

TEST(MemoryEstimateTest, BoundsTheMeasuredCpuPeak) {
  struct Case {
    GptConfig model;
    int64_t micro, global;
  };
  GptConfig recomputed = testing::DefaultRunModel();
  recomputed.recompute.layernorm = recomputed.recompute.moe = recomputed.recompute.core_attn = true;
  GptConfig fused_moe_act = testing::DefaultRunModel();
  fused_moe_act.moe_grouped_mlp = GroupedMlpKind::kFused;
  fused_moe_act.recompute.moe_act = true;
  GptConfig fp8_held = testing::DefaultRunModel();
  fp8_held.moe_grouped_mlp = GroupedMlpKind::kFused;
  fp8_held.fp8_recipe = Fp8Recipe::kBlockwise;
  fp8_held.moe_wgrad_micro_batches = 4;
  for (const Case& c :
       {Case{testing::TinyModel(), 4, 8}, Case{testing::DefaultRunModel(), 8, 16},
        Case{testing::DefaultRunModel(), 64, 64}, Case{recomputed, 64, 64},
        Case{fused_moe_act, 64, 64}, Case{QkNormModel(), 64, 64}, Case{fp8_held, 1, 4}}) {
    TrainerOptions options;
    options.micro_batch_size = c.micro;
    options.global_batch_size = c.global;
    options.train_steps = 2;
    options.warmup_steps = 1;
    options.eval_steps = 1;
    const double measured = MeasuredPeakBytes(c.model, options);
    MemoryEstimateOptions o;
    o.model = c.model;
    o.micro_batch_size = c.micro;
    o.micro_batches = c.global / c.micro;
    const MemoryEstimate e = EstimateTrainingMemory(o);
    const double counted = e.state_bytes + e.activation_bytes + e.workspace_bytes;
    const std::string what = "micro " + std::to_string(c.micro) + ", hidden " +
                             std::to_string(c.model.hidden_size) + ": measured " +
                             std::to_string(measured / 1048576) + " MiB, estimated " +
                             std::to_string(counted / 1048576) + " MiB";
    EXPECT_GE(counted, measured) << what;
    EXPECT_LE(counted, 2.0 * measured) << what;
    std::cout << what << "\n";
  }
}

// Weight gradients once per N micro-batches: min(N, micro-batches) - 1 micro-batches' operands
// per fused MoE layer, routed rows x (2 hidden + 3 ffn) elements each; none on the unfused path.
TEST(MemoryEstimateTest, CountsTheWeightGradientOperandsHeld) {
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.model.moe_grouped_mlp = GroupedMlpKind::kFused;
  o.micro_batch_size = 8;
  o.micro_batches = 8;
  const double plain = EstimateTrainingMemory(o).activation_bytes;
  const GptConfig& m = o.model;
  const double per_micro_batch = 8.0 * m.seq_length * m.moe_router_topk *
                                 (2 * m.hidden_size + 3 * m.moe_ffn_hidden_size) * 4 *
                                 m.num_moe_layers();
  for (const auto& [n, held] : {std::pair{2, 1}, {4, 3}, {8, 7}, {100, 7}}) {
    o.model.moe_wgrad_micro_batches = n;
    EXPECT_DOUBLE_EQ(EstimateTrainingMemory(o).activation_bytes - plain, held * per_micro_batch)
        << n;
  }
  o.micro_batches = 1;
  EXPECT_DOUBLE_EQ(EstimateTrainingMemory(o).activation_bytes, plain)
      << "one micro-batch a step holds nothing";
  o.micro_batches = 8;
  o.model.moe_grouped_mlp = GroupedMlpKind::kUnfused;
  const double unfused = EstimateTrainingMemory(o).activation_bytes;
  o.model.moe_wgrad_micro_batches = 1;
  EXPECT_DOUBLE_EQ(EstimateTrainingMemory(o).activation_bytes, unfused);
}

// Recompute lowers the activations by what the modules no longer keep, and not the workspace
// (a recomputed layer holds everything again while its backward runs).
TEST(MemoryEstimateTest, RecomputeLowersTheActivationsOnly) {
  MemoryEstimateOptions o;
  o.model = testing::DefaultRunModel();
  o.micro_batch_size = 8;
  const MemoryEstimate plain = EstimateTrainingMemory(o);
  double previous = plain.activation_bytes;
  for (bool RecomputeModules::*module :
       {&RecomputeModules::layernorm, &RecomputeModules::core_attn, &RecomputeModules::moe}) {
    o.model.recompute.*module = true;
    const MemoryEstimate e = EstimateTrainingMemory(o);
    EXPECT_LT(e.activation_bytes, previous);
    EXPECT_EQ(e.workspace_bytes, plain.workspace_bytes);
    EXPECT_EQ(e.state_bytes, plain.state_bytes);
    previous = e.activation_bytes;
  }
  // In the first of the model's 2 layers only: between none and all.
  o.model.recompute_num_layers = 1;
  const double first_layer_only = EstimateTrainingMemory(o).activation_bytes;
  EXPECT_LT(first_layer_only, plain.activation_bytes);
  EXPECT_GT(first_layer_only, previous);
}

}  // namespace
}  // namespace moe
