// The trainer under mpirun (2 ranks, and 4 by an explicit registration): every pipeline x
// virtual-chunk x data-parallel layout that fits the world trains like one process on the same
// global batch, up to summation order (losses, aux losses, gradient norms, validation loss and
// every rank's weights after a few steps, relative 1e-5); offloading activations under the
// pipeline schedule changes no bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "engine/dist/process_groups.h"
#include "engine/runtime/device_context.h"
#include "modules/offload_groups.h"
#include "modules/trainer.h"
#include "tests/dist/test_world.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

constexpr int kSteps = 3;
constexpr double kTolerance = 1e-5;

GptConfig TinyConfig() {
  GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.ffn_hidden_size = 64;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  c.moe_grouped_mlp = GroupedMlpKind::kUnfused;
  c.first_dense_layers = 1;
  c.seq_length = 16;
  c.vocab_size = 64;
  return c;
}

TrainerOptions TinyOptions(int virtual_pipeline, bool offload) {
  TrainerOptions o;
  o.micro_batch_size = 1;
  o.global_batch_size = 8;
  o.train_steps = kSteps;
  o.warmup_steps = 1;
  o.eval_steps = 4;
  o.virtual_pipeline = virtual_pipeline;
  if (offload) {
    OffloadOptions options;
    for (const std::string& group : OffloadGroupNames()) options.groups.insert(group);
    options.unpooled_groups = RoutedOffloadGroups();
    options.min_tensor_bytes = 0;
    o.offload = options;
  }
  return o;
}

struct TrainingRun {
  std::vector<StepStats> steps;
  double validation_loss = 0;
  std::map<std::string, std::vector<float>> weights;  // this rank's, by name
};

TrainingRun Train(const TokenSource& source, int virtual_pipeline, bool offload,
                  const ProcessGroups* groups = nullptr) {
  StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(
      TinyConfig(), TinyOptions(virtual_pipeline, offload), Device::CPU(), &source, groups);
  CHECK(created.ok()) << created.status().message();
  Trainer& trainer = **created;
  TrainingRun run;
  for (int step = 0; step < kSteps; ++step) run.steps.push_back(trainer.TrainStep());
  run.validation_loss = trainer.Evaluate();
  for (const auto& p : trainer.parameters().all()) {
    std::vector<float>& w = run.weights[p->name];
    w.resize(p->master.numel());
    std::memcpy(w.data(), p->master.data(), p->master.nbytes());
  }
  return run;
}

void ExpectNear(double actual, double expected, const char* what) {
  EXPECT_LE(std::abs(actual - expected), kTolerance * std::max(1.0, std::abs(expected)))
      << what << ": " << actual << " vs " << expected;
}

class TrainerParallelTest : public ::testing::Test {
 protected:
  TrainerParallelTest()
      : world_(testing::TestWorld::Get()),
        stream_(DeviceContext::Get(Device::CPU()).CreateSideStream()),
        comm_(world_.NewCommunicator(*stream_, std::chrono::seconds(60))) {
    DataOptions data;
    data.vocab_size = TinyConfig().vocab_size;
    source_ = std::move(OpenTokenSource(data)).value();
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
  for (const Layout layout : {Layout{1, 1}, Layout{2, 1}, Layout{2, 2}, Layout{4, 1}}) {
    if (world_.size() % layout.pipeline != 0) continue;
    const int data = world_.size() / layout.pipeline;
    SCOPED_TRACE("pipeline " + std::to_string(layout.pipeline) + " x virtual " +
                 std::to_string(layout.virtual_chunks) + " x data " + std::to_string(data));
    const ProcessGroups groups = SplitProcessGroups(*comm_, layout.pipeline, *stream_);
    const TrainingRun run = Train(*source_, layout.virtual_chunks, /*offload=*/false, &groups);
    ++layouts_run;
    for (int step = 0; step < kSteps; ++step) {
      ExpectNear(run.steps[step].loss, reference.steps[step].loss, "loss");
      ExpectNear(run.steps[step].aux_loss, reference.steps[step].aux_loss, "aux loss");
      ExpectNear(run.steps[step].grad_norm, reference.steps[step].grad_norm, "grad norm");
      EXPECT_EQ(run.steps[step].tokens, reference.steps[step].tokens);
    }
    ExpectNear(run.validation_loss, reference.validation_loss, "validation loss");
    ASSERT_FALSE(run.weights.empty());
    for (const auto& [name, weights] : run.weights) {
      const std::vector<float>& expected = reference.weights.at(name);
      ASSERT_EQ(weights.size(), expected.size()) << name;
      for (size_t i = 0; i < weights.size(); ++i) {
        ASSERT_LE(std::abs(weights[i] - expected[i]),
                  kTolerance * std::max(1.0f, std::abs(expected[i])))
            << name << "[" << i << "]: " << weights[i] << " vs " << expected[i];
      }
    }
  }
  EXPECT_GE(layouts_run, 3);
}

TEST_F(TrainerParallelTest, OffloadUnderThePipelineChangesNoBit) {
  const int pipeline = 2;
  const ProcessGroups groups = SplitProcessGroups(*comm_, pipeline, *stream_);
  for (int virtual_chunks : {1, 2}) {
    SCOPED_TRACE("virtual " + std::to_string(virtual_chunks));
    const TrainingRun off = Train(*source_, virtual_chunks, /*offload=*/false, &groups);
    const TrainingRun on = Train(*source_, virtual_chunks, /*offload=*/true, &groups);
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_EQ(on.steps[step].loss, off.steps[step].loss);
      EXPECT_EQ(on.steps[step].grad_norm, off.steps[step].grad_norm);
      EXPECT_GT(on.steps[step].offload.offloaded_tensors, 0);
    }
    EXPECT_EQ(on.validation_loss, off.validation_loss);
    EXPECT_EQ(on.weights, off.weights);
  }
}

}  // namespace
}  // namespace moe
