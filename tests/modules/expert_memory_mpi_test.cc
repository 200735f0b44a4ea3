// The memory estimate under expert parallelism (modules/memory_estimate.h), on the CPU backend
// under mpirun (2 ranks; 4 by an explicit registration, tests/CMakeLists.txt), for every expert
// group size E > 1 that divides the world and the 4 experts of moe_train's default model (4 layers
// here, 3 of them MoE; micro-batches of 4 sequences, 512 routed rows each):
// - The rows one rank's experts receive in one MoE layer per micro-batch, over 100 training steps,
//   as a multiple of their mean (tokens x top-k): the median, 90th and 99th percentiles and the
//   maximum are printed (tests/results/memory_and_offload.md, "Expert parallelism: rows per
//   rank"), and kExpertRowsMargin covers the 99th percentile.
// - On each rank the estimate bounds the CPU allocator's measured peak of two steps within
//   [1, 2]x, fused and unfused, with and without the distributed optimizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/distributed/process_groups.h"
#include "engine/runtime/device_context.h"
#include "modules/memory_estimate.h"
#include "modules/trainer.h"
#include "tests/distributed/test_world.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

constexpr int64_t kMicro = 4;
constexpr int64_t kMicroBatches = 2;  // per rank and step
constexpr int kRowSteps = 100;

GptConfig Model(GroupedMlpKind kind) {
  GptConfig c = testing::DefaultRunModel();
  c.num_layers = 4;
  c.moe_grouped_mlp = kind;
  return c;
}

TrainerOptions Options(int data_size, int64_t steps, bool distributed_optimizer) {
  TrainerOptions o;
  o.micro_batch_size = kMicro;
  o.global_batch_size = kMicro * kMicroBatches * data_size;
  o.train_steps = steps;
  o.warmup_steps = 1;
  o.eval_steps = 1;
  o.use_distributed_optimizer = distributed_optimizer;
  return o;
}

class ExpertMemoryTest : public ::testing::Test {
 protected:
  ExpertMemoryTest()
      : world_(testing::TestWorld::Get()),
        stream_(DeviceContext::Get(Device::CPU()).CreateSideStream()),
        comm_(world_.NewCommunicator(*stream_, std::chrono::seconds(120))) {
    DataOptions data;
    data.vocab_size = testing::DefaultRunModel().vocab_size;
    source_ = std::move(OpenTokenSource(data)).value();
  }

  // Expert group sizes of this world: E > 1 dividing the world and the experts.
  std::vector<int> ExpertSizes() const {
    std::vector<int> sizes;
    for (int e = 2; e <= world_.size(); e *= 2) {
      if (world_.size() % e == 0 && Model(GroupedMlpKind::kFused).num_experts % e == 0) {
        sizes.push_back(e);
      }
    }
    return sizes;
  }

  std::unique_ptr<Trainer> NewTrainer(const GptConfig& model, const TrainerOptions& options,
                                      const ProcessGroups& groups) {
    StatusOr<std::unique_ptr<Trainer>> created =
        Trainer::Create(model, options, Device::CPU(), source_.get(), &groups);
    CHECK(created.ok()) << created.status().message();
    return std::move(created).value();
  }

  World& world_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<TokenSource> source_;
};

double Quantile(const std::vector<double>& sorted, double q) {
  return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
}

TEST_F(ExpertMemoryTest, TheRowsMarginCoversThe99thPercentileOfARanksRowsPerLayer) {
  for (const int e : ExpertSizes()) {
    SCOPED_TRACE("expert parallel " + std::to_string(e));
    const GptConfig model = Model(GroupedMlpKind::kFused);
    const ProcessGroups groups = SplitProcessGroups(*comm_, 1, e);
    std::unique_ptr<Trainer> trainer =
        NewTrainer(model, Options(world_.size(), kRowSteps, false), groups);
    const double mean = static_cast<double>(kMicro * model.seq_length * model.moe_router_topk);
    std::vector<double> ratios;  // every rank of this rank's group, every layer and micro-batch
    while (trainer->step() < kRowSteps) {
      const StepStats stats = trainer->TrainStep();
      for (int64_t rows : stats.expert_traffic.rows_per_exchange) {
        ratios.push_back(static_cast<double>(rows) / mean);
      }
    }
    ASSERT_EQ(ratios.size(),
              static_cast<size_t>(kRowSteps * kMicroBatches * e * model.num_moe_layers()));
    std::sort(ratios.begin(), ratios.end());
    const double p99 = Quantile(ratios, 0.99);
    if (world_.rank() == 0) {
      printf(
          "E=%d: rows a rank received in one layer per micro-batch / mean (%.0f), %zu samples: "
          "median %.3f, p90 %.3f, p99 %.3f, max %.3f\n",
          e, mean, ratios.size(), Quantile(ratios, 0.5), Quantile(ratios, 0.9), p99, ratios.back());
    }
    EXPECT_LE(p99, kExpertRowsMargin);
  }
}

TEST_F(ExpertMemoryTest, TheEstimateBoundsEachRanksMeasuredCpuPeak) {
  for (const int e : ExpertSizes())
    for (const GroupedMlpKind kind : {GroupedMlpKind::kFused, GroupedMlpKind::kUnfused})
      for (const bool distributed_optimizer : {false, true}) {
        const std::string what = "expert parallel " + std::to_string(e) +
                                 (kind == GroupedMlpKind::kFused ? ", fused" : ", unfused") +
                                 (distributed_optimizer ? ", distributed optimizer" : "");
        SCOPED_TRACE(what);
        const GptConfig model = Model(kind);
        const ProcessGroups groups = SplitProcessGroups(*comm_, 1, e);
        const TrainerOptions options = Options(world_.size(), 2, distributed_optimizer);
        CachingAllocator& allocator = DeviceContext::Get(Device::CPU()).allocator();
        allocator.EmptyCache();
        allocator.ResetPeakStats();
        const double before = static_cast<double>(allocator.stats().allocated_bytes);
        {
          std::unique_ptr<Trainer> trainer = NewTrainer(model, options, groups);
          trainer->TrainStep();
          trainer->TrainStep();
        }
        const double measured =
            static_cast<double>(allocator.stats().peak_allocated_bytes) - before;
        MemoryEstimateOptions o;
        o.model = model;
        o.micro_batch_size = kMicro;
        o.micro_batches = kMicroBatches;
        o.state_shards = distributed_optimizer ? world_.size() : 1;
        o.expert_parallel = e;
        const double counted = EstimateTrainingMemory(o).total_bytes;
        EXPECT_GE(counted, measured) << "rank " << world_.rank();
        EXPECT_LE(counted, 2.0 * measured) << "rank " << world_.rank();
        printf("rank %d, %s: measured %.2f MiB, estimated %.2f MiB (%.2fx)\n", world_.rank(),
               what.c_str(), measured / 1048576, counted / 1048576, counted / measured);
      }
}

}  // namespace
}  // namespace moe
