// The trainer under mpirun (2 ranks, and 4 by an explicit registration): every pipeline x
// virtual-chunk x data-parallel layout that fits the world trains like one process on the same
// global batch, up to summation order (losses, aux losses, gradient norms, validation loss and
// each stage's master weights after a few steps); offloading activations under the pipeline
// schedule changes no bit. Checkpoints under the pipeline (x data) layout resume bit for bit, and
// hold the full model: pipeline and single-process trainers load each other's. The distributed
// optimizer (state sharded over the data group) in every layout with two replicas or more: like
// plain data parallel (bit for bit on the CPU with clipping off), offloading changes no bit of it,
// deterministic, one shard of the state per rank (device memory), checkpoints that resume bit for
// bit and load across layouts both ways. The fused layers' weight gradients once per several
// micro-batches train as one pass per micro-batch does in every layout.
//
// One source, two binaries (tests/CMakeLists.txt): trainer_parallel_mpi_test on the CPU backend
// over MPI (f32: relative 1e-5), and with MOE_TEST_ON_CUDA trainer_parallel_cuda_test, one GPU
// per rank over NCCL (bf16 activations, f32 master weights; see kTolerance and ExpectWeightsNear).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <utility>

#include "engine/core/byte_units.h"
#include "engine/distributed/process_groups.h"
#include "engine/runtime/device_context.h"
#include "modules/trainer.h"
#include "tests/distributed/test_world.h"
#include "tests/testing/parallel_training.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

using testing::kOnCuda;
using testing::RankDevice;

constexpr int kSteps = 3;
// Losses, aux losses and gradient norms agree up to the order of fp32 sums (data-parallel
// all-reduce, gradient-norm partial sums over stages); on CUDA those sums meet bf16 activations.
constexpr double kTolerance = kOnCuda ? 1e-3 : 1e-5;

GptConfig TinyConfig() { return testing::ParallelTestModel(); }

TrainerOptions TinyOptions(int virtual_pipeline, bool offload, bool distributed_optimizer = false,
                           OptimizerDTypes optimizer_dtypes = {}) {
  TrainerOptions o = testing::ParallelTestOptions(kSteps, offload);
  o.use_distributed_optimizer = distributed_optimizer;
  o.optimizer_dtypes = optimizer_dtypes;
  o.virtual_pipeline = virtual_pipeline;
  return o;
}

struct TrainingRun {
  std::vector<StepStats> steps;
  double validation_loss = 0;
  // The f32 master weights of this rank's parameters, by name, on data rank 0 (gathered from the
  // shards under the distributed optimizer); empty on the other data ranks.
  std::map<std::string, std::vector<float>> weights;
  std::map<std::string, std::vector<float>> values;  // this rank's compute values, by name
  // With offloading: this rank's policy table, and every pipeline rank's as gathered for the log.
  std::vector<OffloadGroupSummary> offload_policy;
  std::vector<std::vector<OffloadGroupSummary>> offload_policy_by_rank;
};

TrainingRun Train(const TokenSource& source, int virtual_pipeline, bool offload,
                  const ProcessGroups* groups = nullptr, bool distributed_optimizer = false,
                  float clip_grad = TrainerOptions().adamw.clip_grad,
                  const GptConfig& config = TinyConfig()) {
  TrainerOptions options = TinyOptions(virtual_pipeline, offload, distributed_optimizer);
  options.adamw.clip_grad = clip_grad;
  StatusOr<std::unique_ptr<Trainer>> created =
      Trainer::Create(config, options, RankDevice(), &source, groups);
  CHECK(created.ok()) << created.status().message();
  Trainer& trainer = **created;
  TrainingRun run;
  for (int step = 0; step < kSteps; ++step) run.steps.push_back(trainer.TrainStep());
  run.validation_loss = trainer.Evaluate();
  for (const WholeParameterState& p : trainer.GatherWholeState()) {
    run.weights[p.name] = testing::ToFloats(p.master);
  }
  for (const auto& p : trainer.parameters().all())
    run.values[p->name] = testing::ToFloats(p->value);
  if (offload) {
    run.offload_policy = trainer.offload_manager()->summary();
    run.offload_policy_by_rank = trainer.OffloadPolicyByPipelineRank();  // collective
  }
  return run;
}

// This rank's master weights and AdamW moments on data rank 0 (gathered from the shards under the
// distributed optimizer; empty on the other data ranks), by name ("<name>", ".exp_avg",
// ".exp_avg_sq"). Collective over the data group.
std::map<std::string, std::vector<float>> State(Trainer& trainer) {
  std::map<std::string, std::vector<float>> state;
  for (const WholeParameterState& p : trainer.GatherWholeState()) {
    for (const auto& [suffix, tensor] : {std::pair<std::string, const Tensor*>{"", &p.master},
                                         {".exp_avg", &p.exp_avg},
                                         {".exp_avg_sq", &p.exp_avg_sq}}) {
      state[p.name + suffix] = testing::ToFloats(*tensor);
    }
  }
  return state;
}

void ExpectNear(double actual, double expected, const char* what) {
  testing::ExpectNear(actual, expected, what, kTolerance);
}

// Every rank's master weights against the one-process run's (testing::ExpectWeightsNear).
void ExpectWeightsNear(const std::map<std::string, std::vector<float>>& weights,
                       const std::map<std::string, std::vector<float>>& reference) {
  testing::ExpectWeightsNear(weights, reference, kTolerance,
                             2.0 * TinyOptions(1, false).lr * kSteps);
}

// Trains `resumed` (at step 1) to the end: every step's statistics and the final state are the
// uninterrupted run's (`reference`, whose steps were `uninterrupted`), bit for bit.
void ExpectTrainsOnBitIdentically(Trainer& resumed, const std::vector<StepStats>& uninterrupted,
                                  Trainer& reference) {
  for (int step = 1; step < kSteps; ++step) {
    const StepStats stats = resumed.TrainStep();
    EXPECT_EQ(stats.loss, uninterrupted[step].loss) << "step " << step;
    EXPECT_EQ(stats.aux_loss, uninterrupted[step].aux_loss) << "step " << step;
    EXPECT_EQ(stats.grad_norm, uninterrupted[step].grad_norm) << "step " << step;
  }
  EXPECT_EQ(State(resumed), State(reference));
}

class TrainerParallelTest : public ::testing::Test {
 protected:
  TrainerParallelTest()
      : world_(testing::TestWorld::Get()),
        stream_(DeviceContext::Get(RankDevice()).CreateSideStream()),
        comm_(world_.NewCommunicator(*stream_, std::chrono::seconds(60))) {
    DataOptions data;
    data.vocab_size = TinyConfig().vocab_size;
    source_ = std::move(OpenTokenSource(data)).value();
  }

  // A one-process run of kSteps (the same on every rank), saved into `dir` by rank 0.
  std::unique_ptr<Trainer> TrainOneProcessAndSave(const std::string& dir) {
    std::unique_ptr<Trainer> trained = NewTrainer(nullptr);
    for (int step = 0; step < kSteps; ++step) trained->TrainStep();
    if (world_.rank() == 0) {
      const Status written = trained->Save(dir, {});
      EXPECT_TRUE(written.ok()) << written.message();
    }
    comm_->Barrier();
    return trained;
  }

  std::unique_ptr<Trainer> NewTrainer(const ProcessGroups* groups,
                                      bool distributed_optimizer = false,
                                      OptimizerDTypes optimizer_dtypes = {}) {
    StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(
        TinyConfig(), TinyOptions(1, false, distributed_optimizer, optimizer_dtypes), RankDevice(),
        source_.get(), groups);
    CHECK(created.ok()) << created.status().message();
    return std::move(created).value();
  }

  // A checkpoint root that every rank names alike; rank 0 empties it first.
  std::string CheckpointRoot(const std::string& name) {
    const std::string root =
        ::testing::TempDir() + "/trainer_parallel_" + name + "_np" + std::to_string(world_.size());
    if (world_.rank() == 0) std::filesystem::remove_all(root);
    comm_->Barrier();
    return root;
  }

  World& world_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<TokenSource> source_;
};

TEST_F(TrainerParallelTest, EveryLayoutMatchesOneProcess) {
  const TrainingRun reference = Train(*source_, /*virtual_pipeline=*/1, /*offload=*/false);
  struct Layout {
    int pipeline, virtual_chunks;
  };
  int layouts_run = 0;
  for (const Layout layout : {Layout{1, 1}, Layout{2, 1}, Layout{2, 2}, Layout{4, 1}})
    for (const bool distributed_optimizer : {false, true}) {
      if (world_.size() % layout.pipeline != 0) continue;
      const int data = world_.size() / layout.pipeline;
      SCOPED_TRACE("pipeline " + std::to_string(layout.pipeline) + " x virtual " +
                   std::to_string(layout.virtual_chunks) + " x data " + std::to_string(data) +
                   (distributed_optimizer ? ", distributed optimizer" : ""));
      const ProcessGroups groups = SplitProcessGroups(*comm_, layout.pipeline);
      const TrainingRun run =
          Train(*source_, layout.virtual_chunks, /*offload=*/false, &groups, distributed_optimizer);
      ++layouts_run;
      for (int step = 0; step < kSteps; ++step) {
        ExpectNear(run.steps[step].loss, reference.steps[step].loss, "loss");
        ExpectNear(run.steps[step].aux_loss, reference.steps[step].aux_loss, "aux loss");
        ExpectNear(run.steps[step].grad_norm, reference.steps[step].grad_norm, "grad norm");
        EXPECT_EQ(run.steps[step].tokens, reference.steps[step].tokens);
      }
      ExpectNear(run.validation_loss, reference.validation_loss, "validation loss");
      if (groups.data->rank() == 0) ExpectWeightsNear(run.weights, reference.weights);
    }
  EXPECT_GE(layouts_run, 6);
}

// The fused layers' weight gradients once per 3 micro-batches in every pipeline x virtual x data
// layout that fits the world (8 micro-batches a step on one replica: passes of 3, 3 and the
// last's 2; 4 on each of two: 3 and 1): the executor marks each chunk's last backward, whose pass
// adds before the data group reduces the layer's bucket. CPU: the bits of one pass per
// micro-batch (the CPU adds the parts one by one); CUDA: within kTolerance.
TEST_F(TrainerParallelTest, WeightGradsOncePerMicroBatchesInEveryLayout) {
  GptConfig each = TinyConfig();
  each.moe_grouped_mlp = GroupedMlpKind::kFused;
  GptConfig grouped = each;
  grouped.moe_wgrad_micro_batches = 3;
  const float clip = TrainerOptions().adamw.clip_grad;
  int layouts_run = 0;
  for (const auto& [pipeline, virtual_chunks] :
       {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 1}}) {
    if (world_.size() % pipeline != 0) continue;
    SCOPED_TRACE("pipeline " + std::to_string(pipeline) + " x virtual " +
                 std::to_string(virtual_chunks));
    const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline);
    const TrainingRun a = Train(*source_, virtual_chunks, false, &groups, false, clip, each);
    const TrainingRun b = Train(*source_, virtual_chunks, false, &groups, false, clip, grouped);
    ++layouts_run;
    for (int step = 0; step < kSteps; ++step) {
      if (kOnCuda) {
        ExpectNear(b.steps[step].loss, a.steps[step].loss, "loss");
        ExpectNear(b.steps[step].grad_norm, a.steps[step].grad_norm, "grad norm");
      } else {
        EXPECT_EQ(b.steps[step].loss, a.steps[step].loss);
        EXPECT_EQ(b.steps[step].grad_norm, a.steps[step].grad_norm);
      }
    }
    if (groups.data->rank() != 0) continue;
    if (kOnCuda) {
      ExpectWeightsNear(b.weights, a.weights);
    } else {
      EXPECT_EQ(b.weights, a.weights);
    }
  }
  EXPECT_GE(layouts_run, 3);
}

void ExpectSameRows(const std::vector<OffloadGroupSummary>& got,
                    const std::vector<OffloadGroupSummary>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].candidates, want[i].candidates) << want[i].name;
    EXPECT_EQ(got[i].offloaded, want[i].offloaded) << want[i].name;
    EXPECT_EQ(got[i].tensors, want[i].tensors) << want[i].name;
    EXPECT_EQ(got[i].bytes, want[i].bytes) << want[i].name;
    EXPECT_EQ(got[i].skipped, want[i].skipped) << want[i].name;
  }
}

// Also: the offload policy table gathered for the log holds every pipeline rank's rows, this
// rank's exactly as its own manager reports them.
TEST_F(TrainerParallelTest, OffloadUnderThePipelineChangesNoBit) {
  const int pipeline = 2;
  const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline);
  for (int virtual_chunks : {1, 2})
    for (const bool distributed_optimizer : {false, true}) {
      SCOPED_TRACE("virtual " + std::to_string(virtual_chunks) +
                   (distributed_optimizer ? ", distributed optimizer" : ""));
      const TrainingRun off =
          Train(*source_, virtual_chunks, /*offload=*/false, &groups, distributed_optimizer);
      const TrainingRun on =
          Train(*source_, virtual_chunks, /*offload=*/true, &groups, distributed_optimizer);
      for (int step = 0; step < kSteps; ++step) {
        EXPECT_EQ(on.steps[step].loss, off.steps[step].loss);
        EXPECT_EQ(on.steps[step].grad_norm, off.steps[step].grad_norm);
        EXPECT_GT(on.steps[step].offload.offloaded_tensors, 0);
      }
      EXPECT_EQ(on.validation_loss, off.validation_loss);
      EXPECT_EQ(on.weights, off.weights);
      EXPECT_EQ(on.values, off.values);
      ASSERT_EQ(on.offload_policy_by_rank.size(), static_cast<size_t>(pipeline));
      for (const auto& rows : on.offload_policy_by_rank) EXPECT_FALSE(rows.empty());
      ExpectSameRows(on.offload_policy_by_rank[groups.pipeline->rank()], on.offload_policy);
    }
}

TEST_F(TrainerParallelTest, PipelineCheckpointResumesBitForBit) {
  const ProcessGroups groups = SplitProcessGroups(*comm_, /*pipeline_size=*/2);
  const std::string root = CheckpointRoot("resume");
  std::vector<StepStats> uninterrupted;
  std::unique_ptr<Trainer> reference = NewTrainer(&groups);
  for (int step = 0; step < kSteps; ++step) uninterrupted.push_back(reference->TrainStep());

  std::unique_ptr<Trainer> first = NewTrainer(&groups);
  first->TrainStep();
  const Status saved = first->Save(root, {{"test", "resume"}});
  ASSERT_TRUE(saved.ok()) << saved.message();
  comm_->Barrier();  // rank 0 has written it
  std::unique_ptr<Trainer> resumed = NewTrainer(&groups);
  const Status loaded = resumed->Load(root);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(resumed->step(), 1);
  ExpectTrainsOnBitIdentically(*resumed, uninterrupted, *reference);
  comm_->Barrier();
  if (world_.rank() == 0) std::filesystem::remove_all(root);
}

TEST_F(TrainerParallelTest, PipelineAndSingleProcessLoadEachOthersCheckpoints) {
  const ProcessGroups groups = SplitProcessGroups(*comm_, /*pipeline_size=*/2);
  const std::string from_pipeline = CheckpointRoot("from_pipeline");
  const std::string from_single = CheckpointRoot("from_single");

  // Pipeline -> one process: every rank's parameters arrive in the full model, bit for bit.
  std::unique_ptr<Trainer> pipelined = NewTrainer(&groups);
  for (int step = 0; step < kSteps; ++step) pipelined->TrainStep();
  const Status saved = pipelined->Save(from_pipeline, {});
  ASSERT_TRUE(saved.ok()) << saved.message();
  comm_->Barrier();
  std::unique_ptr<Trainer> single = NewTrainer(nullptr);
  Status loaded = single->Load(from_pipeline);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(single->step(), kSteps);
  const auto single_state = State(*single);
  const auto pipelined_state = State(*pipelined);
  EXPECT_LT(pipelined_state.size(), single_state.size()) << "a stage holds part of the model";
  for (const auto& [name, values] : pipelined_state) {
    ASSERT_TRUE(single_state.count(name)) << name;
    EXPECT_EQ(single_state.at(name), values) << name;
  }

  // One process -> pipeline: every rank takes its stage's parameters out of the full model.
  std::unique_ptr<Trainer> trained = TrainOneProcessAndSave(from_single);
  std::unique_ptr<Trainer> staged = NewTrainer(&groups);
  loaded = staged->Load(from_single);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(staged->step(), kSteps);
  const auto trained_state = State(*trained);
  for (const auto& [name, values] : State(*staged)) {
    ASSERT_TRUE(trained_state.count(name)) << name;
    EXPECT_EQ(trained_state.at(name), values) << name;
  }
  // ... and continues like the single process it came from (up to summation order).
  ExpectNear(staged->TrainStep().loss, trained->TrainStep().loss, "loss after loading");
  comm_->Barrier();
  if (world_.rank() == 0) {
    std::filesystem::remove_all(from_pipeline);
    std::filesystem::remove_all(from_single);
  }
}

// ---------------------------------------------------------------- distributed optimizer

// Every layout with a data group of at least two replicas that fits the world: (pipeline size).
std::vector<int> ShardedLayouts(int world_size) {
  std::vector<int> pipelines;
  for (int pipeline : {1, 2}) {
    if (world_size % pipeline == 0 && world_size / pipeline >= 2) pipelines.push_back(pipeline);
  }
  return pipelines;
}

// The reduced gradients are plain data parallel's (on the CPU bit for bit: the same rank-ordered
// sums); only the gradient norm's summation order differs. With clipping off, losses, weights and
// every rank's values are bit-identical on the CPU; with clipping on (0.05: every step clips) they
// agree within kTolerance, as everything does on CUDA (NCCL's reduce-scatter may add in another
// order than its all-reduce).
TEST_F(TrainerParallelTest, DistributedOptimizerMatchesPlainDataParallel) {
  for (int pipeline : ShardedLayouts(world_.size())) {
    const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline);
    for (const float clip : {0.0f, 0.05f}) {
      SCOPED_TRACE("pipeline " + std::to_string(pipeline) + ", clip " + std::to_string(clip));
      const bool exact = !kOnCuda && clip == 0.0f;
      const TrainingRun plain = Train(*source_, 1, /*offload=*/false, &groups, false, clip);
      const TrainingRun sharded = Train(*source_, 1, /*offload=*/false, &groups, true, clip);
      for (int step = 0; step < kSteps; ++step) {
        if (clip > 0) {
          EXPECT_GT(plain.steps[step].grad_norm, clip) << "step " << step;
        }
        ExpectNear(sharded.steps[step].grad_norm, plain.steps[step].grad_norm, "grad norm");
        if (exact) {
          EXPECT_EQ(sharded.steps[step].loss, plain.steps[step].loss) << "step " << step;
          EXPECT_EQ(sharded.steps[step].aux_loss, plain.steps[step].aux_loss) << "step " << step;
        } else {
          ExpectNear(sharded.steps[step].loss, plain.steps[step].loss, "loss");
          ExpectNear(sharded.steps[step].aux_loss, plain.steps[step].aux_loss, "aux loss");
        }
      }
      if (exact) {
        EXPECT_EQ(sharded.weights, plain.weights);
        EXPECT_EQ(sharded.values, plain.values);
      } else if (groups.data->rank() == 0) {
        ExpectWeightsNear(sharded.weights, plain.weights);
      }
    }
  }
}

TEST_F(TrainerParallelTest, DistributedOptimizerIsDeterministic) {
  const ProcessGroups groups = SplitProcessGroups(*comm_, ShardedLayouts(world_.size()).back());
  const TrainingRun first = Train(*source_, 1, /*offload=*/false, &groups, true);
  const TrainingRun second = Train(*source_, 1, /*offload=*/false, &groups, true);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(first.steps[step].loss, second.steps[step].loss);
    EXPECT_EQ(first.steps[step].aux_loss, second.steps[step].aux_loss);
    EXPECT_EQ(first.steps[step].grad_norm, second.steps[step].grad_norm);
  }
  EXPECT_EQ(first.validation_loss, second.validation_loss);
  EXPECT_EQ(first.weights, second.weights);
  EXPECT_EQ(first.values, second.values);
}

// A rank holds its 1/D of every bucket's master weights (CUDA; on the CPU they are the values)
// and moments, and its device memory after the trainer is made, and at the peak of a step, falls
// by the other shards' bytes: per parameter (1 - 1/D) x 12 (CUDA) or 8 (CPU), padding aside.
TEST_F(TrainerParallelTest, DistributedOptimizerHoldsOneShardOfTheState) {
  const ProcessGroups groups = SplitProcessGroups(*comm_, /*pipeline_size=*/1);
  const int data = groups.data->size();
  CachingAllocator& allocator = DeviceContext::Get(RankDevice()).allocator();
  struct Measured {
    int64_t created_bytes = 0;
    double step_peak_mib = 0;
    int64_t parameters = 0;
  };
  const auto measure = [&](bool distributed) {
    Measured m;
    const int64_t before = allocator.stats().allocated_bytes;
    std::unique_ptr<Trainer> trainer = NewTrainer(&groups, distributed);
    m.created_bytes = allocator.stats().allocated_bytes - before;
    m.parameters = trainer->parameters().NumElements();
    const ParameterSet& set = trainer->parameters();
    const int shards = set.shards(ReplicaGroup::kData);
    EXPECT_EQ(shards, distributed ? data : 1);
    for (const ParameterBucket& b : set.buckets()) {
      EXPECT_EQ(b.exp_avg.numel() * shards, b.layout.numel);
      EXPECT_EQ(b.master.numel() * shards, b.layout.numel);
      EXPECT_EQ(b.master.SharesStorageWith(b.value), !kOnCuda);
    }
    m.step_peak_mib = trainer->TrainStep().peak_device_mib.at(world_.rank());
    return m;
  };
  const Measured plain = measure(false);
  const Measured sharded = measure(true);
  const double sharded_bytes =
      (1.0 - 1.0 / data) * (kOnCuda ? 12.0 : 8.0) * static_cast<double>(plain.parameters);
  const double saved = static_cast<double>(plain.created_bytes - sharded.created_bytes);
  EXPECT_GE(saved, 0.95 * sharded_bytes);
  EXPECT_LE(saved, 1.2 * sharded_bytes);
  const double peak_saved = (plain.step_peak_mib - sharded.step_peak_mib) * kMiB;
  EXPECT_GE(peak_saved, 0.9 * sharded_bytes)
      << plain.step_peak_mib << " vs " << sharded.step_peak_mib << " MiB";
}

// A sharded run saved after one step and resumed repeats the uninterrupted sharded run bit for
// bit (losses, norms, and the whole state gathered at the end), under every sharded layout, with
// f32 and with bf16 moments (gathered, sent down the pipeline and saved as bf16), and with bf16
// gradients too (reduce-scattered in bf16).
TEST_F(TrainerParallelTest, DistributedOptimizerCheckpointResumesBitForBit) {
  for (int pipeline : ShardedLayouts(world_.size())) {
    for (const auto& [grad, moments] :
         {std::pair{DType::kF32, DType::kF32}, std::pair{DType::kF32, DType::kBF16},
          std::pair{DType::kBF16, DType::kBF16}}) {
      SCOPED_TRACE("pipeline " + std::to_string(pipeline) + ", " + DTypeName(grad) +
                   " gradients, " + DTypeName(moments) + " moments");
      const OptimizerDTypes optimizer_dtypes{grad, moments, moments};
      const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline);
      const std::string root = CheckpointRoot("sharded_resume_pp" + std::to_string(pipeline));
      std::unique_ptr<Trainer> reference = NewTrainer(&groups, true, optimizer_dtypes);
      std::vector<StepStats> uninterrupted;
      for (int step = 0; step < kSteps; ++step) uninterrupted.push_back(reference->TrainStep());
      std::unique_ptr<Trainer> first = NewTrainer(&groups, true, optimizer_dtypes);
      first->TrainStep();
      const Status saved = first->Save(root, {{"test", "sharded resume"}});
      ASSERT_TRUE(saved.ok()) << saved.message();
      comm_->Barrier();
      std::unique_ptr<Trainer> resumed = NewTrainer(&groups, true, optimizer_dtypes);
      const Status loaded = resumed->Load(root);
      ASSERT_TRUE(loaded.ok()) << loaded.message();
      ExpectTrainsOnBitIdentically(*resumed, uninterrupted, *reference);
      comm_->Barrier();
      if (world_.rank() == 0) std::filesystem::remove_all(root);
    }
  }
}

// Checkpoints keep the single-process format: a sharded run's checkpoint loads into one process
// with the state the shards hold, and one process's loads into every layout, with and without the
// flag (pipeline x data), each rank then holding exactly its parameters' state (gathered), saving
// it back unchanged, and training on like the one process (up to summation order).
TEST_F(TrainerParallelTest, DistributedOptimizerCheckpointsLoadAcrossLayouts) {
  const std::string from_sharded = CheckpointRoot("from_sharded");
  const std::string from_single = CheckpointRoot("from_single_process");
  const std::string round_trip = CheckpointRoot("round_trip");
  {
    const ProcessGroups groups = SplitProcessGroups(*comm_, /*pipeline_size=*/1);
    std::unique_ptr<Trainer> sharded = NewTrainer(&groups, true);
    for (int step = 0; step < kSteps; ++step) sharded->TrainStep();
    const Status saved = sharded->Save(from_sharded, {});
    ASSERT_TRUE(saved.ok()) << saved.message();
    comm_->Barrier();
    const auto sharded_state = State(*sharded);  // on rank 0
    std::unique_ptr<Trainer> single = NewTrainer(nullptr);
    const Status loaded = single->Load(from_sharded);
    ASSERT_TRUE(loaded.ok()) << loaded.message();
    EXPECT_EQ(single->step(), kSteps);
    if (world_.rank() == 0) {
      EXPECT_EQ(State(*single), sharded_state);
    }
  }

  std::unique_ptr<Trainer> trained = TrainOneProcessAndSave(from_single);
  const auto trained_state = State(*trained);
  const double next_loss = trained->TrainStep().loss;
  for (int pipeline : {1, 2, 4}) {
    if (world_.size() % pipeline != 0) continue;
    for (const bool distributed : {false, true}) {
      SCOPED_TRACE("pipeline " + std::to_string(pipeline) + (distributed ? ", sharded" : ""));
      const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline);
      std::unique_ptr<Trainer> staged = NewTrainer(&groups, distributed);
      const Status loaded = staged->Load(from_single);
      ASSERT_TRUE(loaded.ok()) << loaded.message();
      EXPECT_EQ(staged->step(), kSteps);
      for (const auto& [name, values] : State(*staged)) {
        ASSERT_TRUE(trained_state.count(name)) << name;
        EXPECT_EQ(trained_state.at(name), values) << name;
      }
      const Status saved = staged->Save(round_trip, {});
      ASSERT_TRUE(saved.ok()) << saved.message();
      comm_->Barrier();
      std::unique_ptr<Trainer> reloaded = NewTrainer(nullptr);
      ASSERT_TRUE(reloaded->Load(round_trip).ok());
      EXPECT_EQ(State(*reloaded), trained_state);
      ExpectNear(staged->TrainStep().loss, next_loss, "loss after loading");
      comm_->Barrier();  // every rank has read round_trip before the next layout rewrites it
    }
  }
  comm_->Barrier();
  if (world_.rank() == 0) {
    for (const std::string& root : {from_sharded, from_single, round_trip}) {
      std::filesystem::remove_all(root);
    }
  }
}

}  // namespace
}  // namespace moe
