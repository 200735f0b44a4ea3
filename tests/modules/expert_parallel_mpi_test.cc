// Expert parallelism under mpirun (2 ranks; 4 and 8 by explicit registrations,
// tests/CMakeLists.txt): in every pipeline x data x expert layout the world allows, fused and
// unfused, with and without the distributed optimizer, a run with E > 1 trains as the same layout
// with E = 1 (one expert group per rank) on the same global batch: bit for bit (losses, aux losses,
// validation loss, every master weight), with one or several expert groups (the gradient norm up
// to summation order: its squares are summed over the expert group). Each rank
// holds num_experts / E experts. Checkpoints load across E = 1 and E > 1 both ways and train on
// alike. Routing every token to the first experts (a zero router) sends all rows to their ranks
// and trains as E = 1 does. Offloading changes no bit; the exchanges are traced, timed and counted.
// Layouts that cannot work are refused by Trainer::Create.
//
// One source, two binaries: expert_parallel_mpi_test on the CPU backend over MPI, and with
// MOE_TEST_ON_CUDA expert_parallel_cuda_test, one GPU per rank over NCCL (2 GPUs), where nothing
// is bit for bit (bf16 activations; every source's rows add into one expert gradient): losses
// within 1e-3, weights as testing::ExpectWeightsNear says.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/distributed/process_groups.h"
#include "engine/memory/pinned_host_pool.h"
#include "engine/runtime/device_context.h"
#include "modules/offload_groups.h"
#include "modules/trainer.h"
#include "tests/distributed/test_world.h"
#include "tests/testing/parallel_training.h"
#include "tests/testing/safetensors_edit.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

using testing::kOnCuda;
using testing::RankDevice;

constexpr int kSteps = 4;
// Relative, where sums are taken in another order; on CUDA those sums meet bf16 activations.
constexpr double kTolerance = kOnCuda ? 1e-3 : 1e-5;

GptConfig TinyConfig(GroupedMlpKind kind) {
  GptConfig c = testing::ParallelTestModel();
  c.moe_grouped_mlp = kind;
  return c;
}

TrainerOptions TinyOptions(bool distributed_optimizer, int virtual_pipeline = 1,
                           bool offload = false) {
  TrainerOptions o = testing::ParallelTestOptions(kSteps, offload);
  o.use_distributed_optimizer = distributed_optimizer;
  o.virtual_pipeline = virtual_pipeline;
  o.adamw.clip_grad = 0.0f;  // the norm's summation order differs; its clip factor would too
  return o;
}

struct TrainingRun {
  std::vector<StepStats> steps;
  double validation_loss = 0;
  std::map<std::string, std::vector<float>> weights;  // whole, on data rank 0 of each stage
  std::map<std::string, int64_t> rows;                // this rank's parameters' first dims
};

void ExpectNear(double actual, double expected, const std::string& what) {
  testing::ExpectNear(actual, expected, what, kTolerance);
}

class ExpertParallelTest : public ::testing::Test {
 protected:
  ExpertParallelTest()
      : world_(testing::TestWorld::Get()),
        stream_(DeviceContext::Get(RankDevice()).CreateSideStream()),
        comm_(world_.NewCommunicator(*stream_, std::chrono::seconds(60))) {
    DataOptions data;
    data.vocab_size = testing::TinyModel().vocab_size;
    source_ = std::move(OpenTokenSource(data)).value();
  }

  std::unique_ptr<Trainer> NewTrainer(const GptConfig& config, const ProcessGroups& groups,
                                      bool distributed_optimizer, int virtual_pipeline = 1,
                                      bool offload = false) {
    StatusOr<std::unique_ptr<Trainer>> created =
        Trainer::Create(config, TinyOptions(distributed_optimizer, virtual_pipeline, offload),
                        RankDevice(), source_.get(), &groups);
    CHECK(created.ok()) << created.status().message();
    return std::move(created).value();
  }

  // Trains kSteps from `load` (a checkpoint directory; "" from the start) or from step 0.
  TrainingRun Train(const GptConfig& config, const ProcessGroups& groups,
                    bool distributed_optimizer, const std::string& load = "",
                    int virtual_pipeline = 1, bool offload = false) {
    std::unique_ptr<Trainer> trainer =
        NewTrainer(config, groups, distributed_optimizer, virtual_pipeline, offload);
    if (!load.empty()) {
      const Status loaded = trainer->Load(load);
      CHECK(loaded.ok()) << loaded.message();
    }
    TrainingRun run;
    while (trainer->step() < kSteps) run.steps.push_back(trainer->TrainStep());
    run.validation_loss = trainer->Evaluate();
    for (const WholeParameterState& p : trainer->GatherWholeState()) {
      run.weights[p.name] = testing::ToFloats(p.master);
    }
    for (const auto& p : trainer->parameters().all()) run.rows[p->name] = p->value.dim(0);
    return run;
  }

  // A checkpoint root that every rank names alike; rank 0 empties it first.
  std::string CheckpointRoot(const std::string& name) {
    const std::string root =
        ::testing::TempDir() + "/expert_parallel_" + name + "_np" + std::to_string(world_.size());
    if (world_.rank() == 0) std::filesystem::remove_all(root);
    comm_->Barrier();
    return root;
  }

  struct Layout {
    int pipeline, virtual_chunks, expert;
  };
  // The layouts of this world with E > 1 (E divides the data size and the 4 experts): pipeline 1,
  // 2 (1F1B and interleaved) and 4.
  std::vector<Layout> Layouts() const {
    std::vector<Layout> layouts;
    for (const auto& [pipeline, virtual_chunks] :
         {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 1}}) {
      if (world_.size() % pipeline != 0) continue;
      const int data = world_.size() / pipeline;
      for (int expert : {2, 4}) {
        if (data % expert == 0) layouts.push_back({pipeline, virtual_chunks, expert});
      }
    }
    return layouts;
  }

  World& world_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<TokenSource> source_;
};

// `run` against `reference`: bit for bit when `exact`, else within kTolerance.
void ExpectSameTraining(const TrainingRun& run, const TrainingRun& reference, bool exact) {
  ASSERT_EQ(run.steps.size(), reference.steps.size());
  for (size_t step = 0; step < run.steps.size(); ++step) {
    const std::string at = " at step " + std::to_string(step);
    ExpectNear(run.steps[step].grad_norm, reference.steps[step].grad_norm, "grad norm" + at);
    if (exact) {
      EXPECT_EQ(run.steps[step].loss, reference.steps[step].loss) << at;
      EXPECT_EQ(run.steps[step].aux_loss, reference.steps[step].aux_loss) << at;
    } else {
      ExpectNear(run.steps[step].loss, reference.steps[step].loss, "loss" + at);
      ExpectNear(run.steps[step].aux_loss, reference.steps[step].aux_loss, "aux loss" + at);
    }
  }
  if (exact) {
    EXPECT_EQ(run.validation_loss, reference.validation_loss);
    EXPECT_EQ(run.weights, reference.weights);
    return;
  }
  ExpectNear(run.validation_loss, reference.validation_loss, "validation loss");
  testing::ExpectWeightsNear(run.weights, reference.weights, kTolerance,
                             2.0 * TinyOptions(false).lr * kSteps);
}

TEST_F(ExpertParallelTest, EveryLayoutTrainsAsOneExpertRank) {
  int layouts_run = 0;
  for (const auto& [pipeline, virtual_chunks, expert] : Layouts())
    for (const GroupedMlpKind kind : {GroupedMlpKind::kFused, GroupedMlpKind::kUnfused})
      for (const bool distributed_optimizer : {false, true}) {
        const int data = world_.size() / pipeline;
        SCOPED_TRACE("pipeline " + std::to_string(pipeline) + " (virtual " +
                     std::to_string(virtual_chunks) + ") x data " + std::to_string(data) +
                     ", expert " + std::to_string(expert) +
                     (kind == GroupedMlpKind::kFused ? ", fused" : ", unfused") +
                     (distributed_optimizer ? ", distributed optimizer" : ""));
        const GptConfig config = TinyConfig(kind);
        const ProcessGroups plain = SplitProcessGroups(*comm_, pipeline);
        const TrainingRun reference =
            Train(config, plain, distributed_optimizer, "", virtual_chunks);
        const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline, expert);
        const TrainingRun run = Train(config, groups, distributed_optimizer, "", virtual_chunks);
        ++layouts_run;
        for (const auto& [name, rows] : run.rows) {
          const bool is_expert = name.find(".experts.") != std::string::npos;
          EXPECT_EQ(rows, is_expert ? config.num_experts / expert : reference.rows.at(name))
              << name;
        }
        if (groups.data->rank() == 0) {
          ExpectSameTraining(run, reference, /*exact=*/!kOnCuda);
        }
      }
  EXPECT_GE(layouts_run, 4);
}

TEST_F(ExpertParallelTest, CheckpointsLoadAcrossExpertLayouts) {
  const int expert = 2;
  const GptConfig config = TinyConfig(GroupedMlpKind::kFused);
  const ProcessGroups plain = SplitProcessGroups(*comm_, 1);
  const ProcessGroups groups = SplitProcessGroups(*comm_, 1, expert);
  for (const bool distributed_optimizer : {false, true})
    for (const bool save_with_experts_split : {true, false}) {
      SCOPED_TRACE(std::string(save_with_experts_split ? "E = 2 -> 1" : "E = 1 -> 2") +
                   (distributed_optimizer ? ", distributed optimizer" : ""));
      const std::string root = CheckpointRoot("across");
      const ProcessGroups& saving = save_with_experts_split ? groups : plain;
      const ProcessGroups& loading = save_with_experts_split ? plain : groups;
      std::unique_ptr<Trainer> saver = NewTrainer(config, saving, distributed_optimizer);
      saver->TrainStep();
      ASSERT_TRUE(saver->Save(root, {}).ok());
      comm_->Barrier();
      const TrainingRun uninterrupted = Train(config, saving, distributed_optimizer, root);
      const TrainingRun resumed = Train(config, loading, distributed_optimizer, root);
      ASSERT_EQ(resumed.steps.size(), static_cast<size_t>(kSteps - 1));
      if (plain.data->rank() == 0) ExpectSameTraining(resumed, uninterrupted, /*exact=*/!kOnCuda);
    }
}

// A zero router scores every expert alike, so every token picks the first top-k experts: under
// E = 2 all rows go to rank 0 of each expert group and rank 1 receives none.
TEST_F(ExpertParallelTest, EveryTokenToOneRankTrainsAsOneExpertRank) {
  const GptConfig config = TinyConfig(GroupedMlpKind::kFused);
  const ProcessGroups plain = SplitProcessGroups(*comm_, 1);
  const ProcessGroups groups = SplitProcessGroups(*comm_, 1, 2);
  const std::string root = CheckpointRoot("zero_router");
  {
    std::unique_ptr<Trainer> start = NewTrainer(config, plain, false);
    ASSERT_TRUE(start->Save(root, {}).ok());
  }
  if (world_.rank() == 0) {
    EXPECT_EQ(
        testing::OverwriteF32Tensors(root + "/step_00000000/model.safetensors", ".router.", 0.0f),
        config.num_moe_layers());
  }
  comm_->Barrier();
  const TrainingRun reference = Train(config, plain, false, root);
  const TrainingRun run = Train(config, groups, false, root);
  const std::vector<int64_t>& rows = run.steps[0].expert_traffic.rows_per_rank;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_GT(rows[0], 0);
  EXPECT_EQ(rows[1], 0);
  if (plain.data->rank() == 0) ExpectSameTraining(run, reference, /*exact=*/!kOnCuda);
}

// Offloading every group (the routed ones outside the pinned pool: their rows change with every
// step and rank) changes no bit under expert parallelism.
TEST_F(ExpertParallelTest, OffloadChangesNoBit) {
  const ProcessGroups groups = SplitProcessGroups(*comm_, 1, 2);
  for (const GroupedMlpKind kind : {GroupedMlpKind::kFused, GroupedMlpKind::kUnfused}) {
    const GptConfig config = TinyConfig(kind);
    const TrainingRun off = Train(config, groups, false);
    const TrainingRun on = Train(config, groups, false, "", 1, /*offload=*/true);
    if (groups.data->rank() == 0) ExpectSameTraining(on, off, /*exact=*/true);
  }
}

// Why the routed offload groups bypass the pinned pool (modules/offload_groups.h): under expert
// parallelism the bytes a rank's fused_group_mlp groups hold change from step to step (the rows it
// receives do), where on one expert rank they are the same every step (tokens x top-k rows), so
// buffers reserved by one step's sizes (the pool's classes, the planner's reservations) would be
// too small for a later step or hold more than it needs. They go through the unpooled cache.
TEST_F(ExpertParallelTest, RoutedOffloadGroupsChangeSizeEveryStep) {
  const GptConfig config = TinyConfig(GroupedMlpKind::kFused);
  TrainerOptions options = TinyOptions(false, 1, /*offload=*/true);
  options.offload->groups = {kFusedGroupMlpGroup};
  options.train_steps = 6;
  const auto offloaded_bytes = [&](const ProcessGroups& groups) {
    StatusOr<std::unique_ptr<Trainer>> created =
        Trainer::Create(config, options, RankDevice(), source_.get(), &groups);
    CHECK(created.ok()) << created.status().message();
    std::set<int64_t> sizes;
    for (int step = 0; step < options.train_steps; ++step) {
      sizes.insert((*created)->TrainStep().offload.offloaded_bytes);
    }
    return sizes;
  };
  const PinnedPoolStats before = DeviceContext::Get(RankDevice()).pinned_pool().stats();
  const std::set<int64_t> one_rank = offloaded_bytes(SplitProcessGroups(*comm_, 1));
  const std::set<int64_t> split = offloaded_bytes(SplitProcessGroups(*comm_, 1, 2));
  const PinnedPoolStats after = DeviceContext::Get(RankDevice()).pinned_pool().stats();
  EXPECT_EQ(one_rank.size(), 1u);
  EXPECT_GT(split.size(), 1u) << "the same bytes in every step";
  EXPECT_GT(after.unpooled_allocations, before.unpooled_allocations);
  EXPECT_EQ(after.pooled_in_use_bytes, 0);
}

// A traced step shows each exchange on the expert-parallel comm track: four per MoE layer and
// micro-batch (dispatch and combine, forward and backward); the expert-parallel wait is a phase.
TEST_F(ExpertParallelTest, TheExchangesAreTracedAndTimed) {
  const ProcessGroups groups = SplitProcessGroups(*comm_, 1, 2);
  const GptConfig config = TinyConfig(GroupedMlpKind::kFused);
  std::unique_ptr<Trainer> trainer = NewTrainer(config, groups, false);
  const StepStats stats = trainer->TrainStep(/*trace=*/true);
  int64_t spans = 0;
  for (const TraceEvent& e : stats.trace) {
    if (e.kind == TraceEvent::Kind::kSpan && e.track == TraceTrack::kExpertParallelComm) ++spans;
  }
  const int64_t micro_batches = TinyOptions(false).global_batch_size / groups.data->size();
  EXPECT_EQ(spans, 4 * config.num_moe_layers() * micro_batches);
  EXPECT_GT(stats.breakdown[StepPhase::kExpertParallelWait], 0.0);
  // Rows: every routed row of the group reaches one rank; bytes: what this rank sent out.
  const int64_t group_rows =
      2 * micro_batches * config.seq_length * config.moe_router_topk * config.num_moe_layers();
  int64_t received = 0, routed = 0;
  for (int64_t rows : stats.expert_traffic.rows_per_rank) received += rows;
  for (int64_t rows : stats.expert_traffic.rows_per_expert) routed += rows;
  EXPECT_EQ(received, group_rows);
  EXPECT_EQ(routed, group_rows);
  EXPECT_GT(stats.expert_traffic.bytes_sent, 0);
}

TEST_F(ExpertParallelTest, LayoutsThatCannotWorkAreRefused) {
  ASSERT_EQ(world_.size() % 2, 0) << "run under mpirun with an even number of ranks";
  const ProcessGroups groups = SplitProcessGroups(*comm_, 1, 2);
  GptConfig odd_experts = TinyConfig(GroupedMlpKind::kFused);
  odd_experts.num_experts = 3;
  GptConfig dense = TinyConfig(GroupedMlpKind::kFused);
  dense.first_dense_layers = dense.num_layers;
  for (const auto& [config, message] :
       {std::pair{odd_experts, "--expert_model_parallel_size=2 does not divide --num_experts=3"},
        std::pair{dense, "--expert_model_parallel_size=2 needs MoE layers"}}) {
    const StatusOr<std::unique_ptr<Trainer>> created =
        Trainer::Create(config, TinyOptions(false), RankDevice(), source_.get(), &groups);
    ASSERT_FALSE(created.ok());
    EXPECT_NE(created.status().message().find(message), std::string::npos)
        << created.status().message();
  }
}

}  // namespace
}  // namespace moe
