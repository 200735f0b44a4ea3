// The per-rank memory estimate (modules/layout_estimate.h): with one stage it is
// EstimateTrainingMemory's, field by field, for every option that changes it; with a pipeline each
// rank counts its own layers and ends (the parameters add up to the model's), the passes the
// schedule holds in flight, and stays within EstimateTrainingMemory's bound; the state splits
// into weights, gradients and optimizer bytes, under expert parallelism with the rank's share of
// the experts and their state sharded over the expert-data group; a layout that is not one is the
// partition's error.
#include "modules/layout_estimate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "modules/model_presets.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

void ExpectSameEstimate(const MemoryEstimate& a, const MemoryEstimate& b, const std::string& what) {
  EXPECT_EQ(a.parameters, b.parameters) << what;
  EXPECT_EQ(a.state_bytes, b.state_bytes) << what;
  EXPECT_EQ(a.activation_bytes, b.activation_bytes) << what;
  EXPECT_EQ(a.workspace_bytes, b.workspace_bytes) << what;
  EXPECT_EQ(a.total_bytes, b.total_bytes) << what;
}

MemoryEstimateOptions Options(const GptConfig& model, int64_t micro, int64_t micro_batches) {
  MemoryEstimateOptions o;
  o.model = model;
  o.micro_batch_size = micro;
  o.micro_batches = micro_batches;
  return o;
}

TEST(LayoutEstimateTest, OneStageIsTheTrainingEstimate) {
  std::vector<std::pair<std::string, MemoryEstimateOptions>> cases;
  for (const GptConfig& m : {testing::TinyModel(), testing::DefaultRunModel(),
                             ModelPresetNamed("moe_100m"), ModelPresetNamed("qwen3_moe_8layer")}) {
    cases.push_back({"plain", Options(m, 4, 4)});
  }
  MemoryEstimateOptions o = Options(ModelPresetNamed("moe_100m"), 2, 8);
  o.cuda = true;
  cases.push_back({"cuda", o});
  o.state_shards = 8;
  o.dtypes = {DType::kBF16, DType::kBF16, DType::kBF16};
  cases.push_back({"sharded bf16 state", o});
  o.model.recompute.layernorm = o.model.recompute.core_attn = true;
  cases.push_back({"recompute", o});
  o.model.recompute_num_layers = 3;
  cases.push_back({"recompute in 3 layers", o});
  o.model.moe_wgrad_micro_batches = 4;
  cases.push_back({"weight gradients once per 4 micro-batches", o});
  o.model.moe_grouped_mlp = GroupedMlpKind::kUnfused;
  o.model.moe_z_loss_coeff = 1e-3f;
  cases.push_back({"unfused, z-loss", o});
  o.expert_parallel = 4;
  cases.push_back({"expert parallel 4", o});
  o.cuda = false;
  cases.push_back({"expert parallel 4 on the CPU", o});
  for (const auto& [what, options] : cases) {
    StatusOr<LayoutMemoryEstimate> layout = EstimateLayoutMemory(options);
    ASSERT_TRUE(layout.ok()) << layout.status().message();
    ASSERT_EQ(layout->ranks.size(), 1u);
    const RankMemoryEstimate& r = layout->ranks[0];
    ExpectSameEstimate(r.memory, EstimateTrainingMemory(options), what);
    EXPECT_EQ(r.passes_in_flight, 1) << what;
    EXPECT_TRUE(r.embedding && r.head) << what;
    EXPECT_EQ(r.weight_bytes + r.gradient_bytes + r.optimizer_bytes, r.memory.state_bytes) << what;
  }
}

// Weights in the compute dtype, gradients in theirs, the rest (moments; CUDA's f32 master) sharded.
TEST(LayoutEstimateTest, StateSplitsIntoWeightsGradientsAndOptimizer) {
  MemoryEstimateOptions o = Options(testing::DefaultRunModel(), 4, 4);
  o.cuda = true;
  o.state_shards = 4;
  const RankMemoryEstimate r = EstimateLayoutMemory(o)->ranks[0];
  const double n = r.memory.parameters;
  EXPECT_EQ(n, static_cast<double>(o.model.total_parameters()));
  EXPECT_EQ(r.weight_bytes, 2 * n);
  EXPECT_EQ(r.gradient_bytes, 4 * n);
  EXPECT_EQ(r.optimizer_bytes, 3 * n);  // (4 master + 8 moments) / 4
  o.cuda = false;
  o.dtypes.grad = DType::kBF16;
  const RankMemoryEstimate cpu = EstimateLayoutMemory(o)->ranks[0];
  EXPECT_EQ(cpu.weight_bytes, 4 * n);
  EXPECT_EQ(cpu.gradient_bytes, 2 * n);
  EXPECT_EQ(cpu.optimizer_bytes, 2 * n);  // 8 moments / 4
}

// Expert parallelism over E ranks: a rank holds 1 / E of the experts (the default model's one MoE
// layer: 4 x 3 x 128 x 128), their master and moments sharded over the expert-data group (data 4 /
// E ranks): CUDA, f32 state: 2 + 4 + 12 / (4 / E) bytes per expert parameter, 2 + 4 + 12 / 4 per
// other one. Its pipeline ranks' parameters add up to the rank's share of the model.
TEST(LayoutEstimateTest, ExpertParallelSplitsTheExpertsAndShardsTheirStateOverTheirGroup) {
  MemoryEstimateOptions o = Options(testing::DefaultRunModel(), 4, 4);
  o.cuda = true;
  o.state_shards = 4;
  const double experts = 4.0 * 3 * 128 * 128;
  const double dense = static_cast<double>(o.model.total_parameters()) - experts;
  for (const int64_t e : {2, 4}) {
    SCOPED_TRACE("expert parallel " + std::to_string(e));
    o.expert_parallel = e;
    const RankMemoryEstimate r = EstimateLayoutMemory(o)->ranks[0];
    const double local = experts / static_cast<double>(e);
    EXPECT_EQ(r.memory.parameters, dense + local);
    EXPECT_EQ(r.weight_bytes, 2 * (dense + local));
    EXPECT_EQ(r.gradient_bytes, 4 * (dense + local));
    EXPECT_EQ(r.optimizer_bytes, 3 * dense + 12.0 / static_cast<double>(4 / e) * local);
  }
  MemoryEstimateOptions piped = Options(ModelPresetNamed("moe_100m"), 2, 8);
  piped.pipeline_parallel = 4;
  piped.expert_parallel = 8;
  const GptConfig& m = piped.model;
  const double model_experts = static_cast<double>(m.num_moe_layers() * m.num_experts) *
                               static_cast<double>(m.expert_parameters());
  double parameters = 0;
  for (const RankMemoryEstimate& r : EstimateLayoutMemory(piped)->ranks) {
    parameters += r.memory.parameters;
  }
  EXPECT_EQ(parameters, static_cast<double>(m.total_parameters()) - model_experts * 7 / 8);
}

// 1F1B: rank r of p holds min(p - r, m) micro-batches of its own layers; the embedding on rank 0,
// the head on the last; every rank within the busiest-rank bound.
TEST(LayoutEstimateTest, EachPipelineRankCountsItsOwnStagesAndPassesInFlight) {
  MemoryEstimateOptions o = Options(ModelPresetNamed("moe_100m"), 2, 8);
  o.pipeline_parallel = 4;
  StatusOr<LayoutMemoryEstimate> layout = EstimateLayoutMemory(o);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  ASSERT_EQ(layout->ranks.size(), 4u);
  const MemoryEstimate bound = EstimateTrainingMemory(o);
  double parameters = 0;
  for (const RankMemoryEstimate& r : layout->ranks) {
    parameters += r.memory.parameters;
    EXPECT_EQ(r.passes_in_flight, 4 - r.rank);
    EXPECT_EQ(r.embedding, r.rank == 0);
    EXPECT_EQ(r.head, r.rank == 3);
    ASSERT_EQ(r.chunks.size(), 1u);
    EXPECT_EQ(r.chunks[0].begin, 2 * r.rank);
    EXPECT_EQ(r.chunks[0].end, 2 * r.rank + 2);
    EXPECT_LE(r.memory.total_bytes, bound.total_bytes) << r.rank;
    EXPECT_LE(r.memory.activation_bytes, bound.activation_bytes) << r.rank;
  }
  EXPECT_EQ(parameters, static_cast<double>(o.model.total_parameters()));
  EXPECT_EQ(layout->busiest().rank, 0);
  // The middle ranks hold fewer passes of the same layers.
  EXPECT_GT(layout->ranks[1].memory.activation_bytes, layout->ranks[2].memory.activation_bytes);
}

// Interleaved: the passes the schedule holds (engine/pipeline/schedule.h's warmup + 1), each of one
// chunk; a fixed first stage changes the ranks' layers.
TEST(LayoutEstimateTest, InterleavedAndFixedEndStagesFollowThePartition) {
  MemoryEstimateOptions o = Options(ModelPresetNamed("moe_100m"), 1, 8);
  o.pipeline_parallel = 2;
  o.virtual_pipeline = 2;
  const LayoutMemoryEstimate interleaved = EstimateLayoutMemory(o).value();
  ASSERT_EQ(interleaved.ranks[0].chunks.size(), 2u);
  EXPECT_EQ(interleaved.ranks[0].chunks[1].begin, 4);  // chunk 1 of rank 0 is stage 2
  EXPECT_EQ(interleaved.ranks[0].passes_in_flight, 2 * (2 - 0 - 1) + (2 - 1) * 2 + 1);
  EXPECT_EQ(interleaved.ranks[1].passes_in_flight, (2 - 1) * 2 + 1);
  EXPECT_TRUE(interleaved.ranks[1].head && !interleaved.ranks[0].head);

  o.virtual_pipeline = 1;
  o.first_stage_layers = 2;
  const LayoutMemoryEstimate fixed = EstimateLayoutMemory(o).value();
  EXPECT_EQ(fixed.ranks[0].chunks[0].end, 2);
  EXPECT_EQ(fixed.ranks[1].chunks[0].size(), 6);
  o.first_stage_layers = 9;
  const StatusOr<LayoutMemoryEstimate> bad = EstimateLayoutMemory(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--first_stage_layers=9"), std::string::npos)
      << bad.status().message();
}

// The layer partition's errors, word for word (the trainer gives the same).
TEST(LayoutEstimateTest, ALayoutThatIsNotOneIsThePartitionsError) {
  MemoryEstimateOptions o = Options(testing::DefaultRunModel(), 4, 4);
  o.pipeline_parallel = 4;
  EXPECT_EQ(EstimateLayoutMemory(o).status().message(),
            "--num_layers=2 is fewer than the 4 pipeline stages (--pipeline_parallel=4 x "
            "--virtual_pipeline=1); every stage needs at least one layer");
}

}  // namespace
}  // namespace moe
