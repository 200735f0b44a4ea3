// The memory planner (modules/memory_planner.h) against real training on the test device: the
// sizes it plans with are what the model saves (the offload manager's count, group by group);
// its predicted peak is the allocator's measured peak within 5% for several budgets and both
// grouped MLPs (the fused one also with the FP8 recipe), and the measured peak stays under the
// budget; every plan trains bit for bit like no plan; plans obey the combination rules; more
// measured excess plans more savings; a budget nothing can meet is one error naming the flag and
// the shortfall.
//
// One source, two binaries (tests/CMakeLists.txt): memory_planner_test on the CPU backend and,
// with MOE_TEST_ON_CUDA, memory_planner_cuda_test on a GPU (bf16 activations).
#include "modules/memory_planner.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "engine/core/byte_units.h"
#include "engine/runtime/device_context.h"
#include "modules/memory_estimate.h"
#include "modules/offload_groups.h"
#include "modules/trainer.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/test_device.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const Device kDevice = testing::kTestDevice;

// The expert layer a test case runs: the grouped MLP, and the fused one also with the FP8 recipe.
struct ExpertLayer {
  GroupedMlpKind mlp;
  Fp8Recipe fp8 = Fp8Recipe::kNone;
};

// moe_train's default model with 4 layers.
GptConfig Model(ExpertLayer expert) {
  GptConfig m = testing::DefaultRunModel();
  m.num_layers = 4;
  m.moe_grouped_mlp = expert.mlp;
  m.fp8_recipe = expert.fp8;
  return m;
}

constexpr int64_t kMicro = 16, kGlobal = 32;

MemoryPlanRequest Request(const GptConfig& model, double budget_bytes) {
  MemoryPlanRequest r;
  r.run.model = model;
  r.run.micro_batch_size = kMicro;
  r.run.micro_batches = kGlobal / kMicro;
  r.run.cuda = kDevice.is_cuda();
  r.budget_bytes = budget_bytes;
  r.offload_candidates = EligibleOffloadGroups(model.moe_grouped_mlp);
  r.recompute_candidates = {RecomputeModuleNames().begin(), RecomputeModuleNames().end()};
  r.min_tensor_bytes = 0;
  r.speeds = PlannerSpeeds::Defaults(r.run.cuda);
  return r;
}

TrainerOptions Options(const GptConfig& model, const MemoryPlan* plan) {
  TrainerOptions o;
  o.micro_batch_size = kMicro;
  o.global_batch_size = kGlobal;
  o.train_steps = 10;
  o.warmup_steps = 1;
  o.eval_steps = 1;
  if (plan != nullptr) {
    OffloadOptions offload;
    offload.groups = EligibleOffloadGroups(model.moe_grouped_mlp);
    for (const std::string& g : RoutedOffloadGroups()) {
      if (offload.groups.count(g)) offload.unpooled_groups.insert(g);
    }
    offload.min_tensor_bytes = 0;
    offload.planned = plan->offload;
    o.offload = offload;
  }
  return o;
}

std::unique_ptr<TokenSource> Synthetic(int64_t vocab) {
  DataOptions data;
  data.vocab_size = vocab;
  return std::move(OpenTokenSource(data)).value();
}

struct TrainedRun {
  std::vector<StepStats> steps;
  std::vector<std::vector<uint32_t>> weights;  // master weights' bits after the last step
  std::vector<OffloadGroupSummary> offload;    // the manager's summary (with a plan)
};

// Two steps from a clean allocator; StepStats::peak_device_mib is the allocator's peak since.
TrainedRun Train(GptConfig model, const MemoryPlan* plan) {
  if (plan != nullptr) model.recompute_by_layer = plan->recompute_by_layer;
  CachingAllocator& allocator = DeviceContext::Get(kDevice).allocator();
  allocator.EmptyCache();
  allocator.ResetPeakStats();
  const auto source = Synthetic(model.vocab_size);
  auto trainer =
      std::move(Trainer::Create(model, Options(model, plan), kDevice, source.get())).value();
  TrainedRun run;
  for (int step = 0; step < 2; ++step) run.steps.push_back(trainer->TrainStep());
  for (const auto& p : trainer->parameters().all()) {
    run.weights.push_back(testing::FloatBits(p->master));
  }
  if (trainer->offload_manager() != nullptr) run.offload = trainer->offload_manager()->summary();
  return run;
}

class MemoryPlannerTest : public ::testing::TestWithParam<ExpertLayer> {};

// The fused layers' weight gradients once per 2 micro-batches hold the first micro-batch's
// operands through the second: the planner counts them, its predicted peak is the measured one,
// and the measured peak grows by about what they hold.
TEST(MemoryPlannerWeightGradTest, CountsTheOperandsHeldForALaterMicroBatch) {
  GptConfig each = Model({GroupedMlpKind::kFused});
  GptConfig grouped = each;
  grouped.moe_wgrad_micro_batches = 2;
  const double pending =
      PendingWeightGradBytes(grouped, kMicro, 1, kGlobal / kMicro,
                             static_cast<double>(grouped.num_moe_layers()), kDevice.is_cuda());
  ASSERT_GT(pending, 0);
  const double measured_each = Train(each, nullptr).steps.back().peak_device_mib[0] * kMiB;
  const double measured = Train(grouped, nullptr).steps.back().peak_device_mib[0] * kMiB;
  StatusOr<MemoryPlan> plan_each = PlanMemory(Request(each, 2 * measured));
  StatusOr<MemoryPlan> plan = PlanMemory(Request(grouped, 2 * measured));
  ASSERT_TRUE(plan_each.ok() && plan.ok());
  printf("held operands %.2f MiB; peaks measured %.2f -> %.2f MiB, predicted %.2f -> %.2f\n",
         pending / kMiB, measured_each / kMiB, measured / kMiB, plan_each->peak_bytes() / kMiB,
         plan->peak_bytes() / kMiB);
  EXPECT_NEAR(plan->peak_bytes() - plan_each->peak_bytes(), pending, kMiB);
  EXPECT_NEAR(plan->peak_bytes(), measured, std::max(0.05 * measured, kMiB));
  EXPECT_NEAR(measured - measured_each, pending, 0.1 * pending + kMiB);
}

// Every group's bytes per micro-batch, as the planner counts them and as the model saved them;
// also with Qwen3's query/key norm on a head dim other than hidden / heads (128 on 2 heads beside
// hidden 128), whose inputs qkv_linear holds.
TEST_P(MemoryPlannerTest, PlansWithTheBytesTheModelSaves) {
  GptConfig qk_norm = Model(GetParam());
  qk_norm.qk_layernorm = true;
  qk_norm.kv_channels = 128;
  for (const GptConfig& model : {Model(GetParam()), qk_norm}) {
    SCOPED_TRACE(model.qk_layernorm ? "query/key norm" : "plain");
    MemoryPlan everything;
    for (int layer = 0; layer < model.num_layers; ++layer) {
      everything.recompute_by_layer.push_back({});
      for (const std::string& g : EligibleOffloadGroups(model.moe_grouped_mlp)) {
        everything.offload.insert({layer, g});
      }
    }
    const TrainedRun run = Train(model, &everything);
    std::map<std::string, double> counted;
    for (int layer = 0; layer < model.num_layers; ++layer) {
      for (const SavedTensorSize& s :
           LayerSaves(model, kMicro, 1, model.is_moe_layer(layer), kDevice.is_cuda(), {})) {
        if (!s.group.empty()) counted[s.group] += s.bytes;
      }
    }
    ASSERT_FALSE(run.offload.empty());
    for (const OffloadGroupSummary& group : run.offload) {
      EXPECT_EQ(static_cast<double>(group.bytes), counted[group.name]) << group.name;
      EXPECT_EQ(group.skipped, 0) << group.name;
    }
  }
}

// For budgets from "keeps everything" down: the predicted peak is the measured one within 5%,
// the measured peak is under the budget, training is bit-identical, the layers' choices are valid.
TEST_P(MemoryPlannerTest, PredictsTheMeasuredPeakUnderEveryBudgetAndTrainsBitIdentically) {
  const GptConfig model = Model(GetParam());
  const TrainedRun reference = Train(model, nullptr);
  const double unplanned = reference.steps.back().peak_device_mib[0] * kMiB;
  // Down to the first budget nothing meets (bf16 on CUDA halves the activations, not the state:
  // its range is narrower).
  int planned_savings = 0, budgets = 0;
  for (double fraction : {1.10, 0.95, 0.90, 0.85, 0.80, 0.75, 0.70, 0.65}) {
    const double budget = fraction * unplanned;
    StatusOr<MemoryPlan> plan = PlanMemory(Request(model, budget));
    if (!plan.ok()) {
      EXPECT_NE(plan.status().message().find("more than the budget"), std::string::npos);
      break;
    }
    ++budgets;
    const TrainedRun run = Train(model, &*plan);
    const double measured = run.steps.back().peak_device_mib[0] * kMiB;
    const double predicted = plan->peak_bytes();
    printf("budget %.2f MiB: predicted %.2f MiB, measured %.2f MiB (keeping everything %.2f)\n",
           budget / kMiB, predicted / kMiB, measured / kMiB, unplanned / kMiB);
    EXPECT_NEAR(predicted, measured, std::max(0.05 * measured, kMiB)) << fraction;
    EXPECT_LE(measured, budget) << fraction;
    planned_savings += static_cast<int>(plan->offload.size());
    for (int layer = 0; layer < model.num_layers; ++layer) {
      std::set<std::string> groups;
      for (const auto& [l, g] : plan->offload) {
        if (l == layer) groups.insert(g);
      }
      const RecomputeModules& r = plan->recompute_by_layer[layer];
      planned_savings += r.any() ? 1 : 0;
      EXPECT_TRUE(CheckOffloadGroups(groups, model.moe_grouped_mlp, "offload").ok()) << layer;
      EXPECT_TRUE(CheckRecomputeWithOffload(r, groups).ok()) << layer;
      EXPECT_FALSE(r.moe && r.moe_act) << layer;
    }
    for (size_t step = 0; step < run.steps.size(); ++step) {
      EXPECT_EQ(run.steps[step].loss, reference.steps[step].loss) << fraction;
      EXPECT_EQ(run.steps[step].aux_loss, reference.steps[step].aux_loss) << fraction;
      EXPECT_EQ(run.steps[step].grad_norm, reference.steps[step].grad_norm) << fraction;
    }
    EXPECT_EQ(run.weights, reference.weights) << fraction;
  }
  EXPECT_GT(planned_savings, 0) << "no budget made the planner offload or recompute anything";
  EXPECT_GE(budgets, 3) << "too few budgets the planner could meet";
}

// Nothing to save under an ample budget; a lower budget, or measured excess, saves more.
TEST_P(MemoryPlannerTest, SavesOnlyWhatTheBudgetNeeds) {
  const GptConfig model = Model(GetParam());
  const MemoryPlan ample = std::move(PlanMemory(Request(model, 1e12))).value();
  EXPECT_TRUE(ample.offload.empty());
  for (const RecomputeModules& r : ample.recompute_by_layer) EXPECT_FALSE(r.any());
  EXPECT_EQ(ample.ranks[0].peak_bytes, ample.ranks[0].baseline_peak_bytes);

  const double budget = 0.92 * ample.ranks[0].baseline_peak_bytes;
  const MemoryPlan plan = std::move(PlanMemory(Request(model, budget))).value();
  EXPECT_LE(plan.peak_bytes(), budget);
  MemoryPlanRequest over = Request(model, budget);
  over.excess_bytes = {kMiB};
  const MemoryPlan replanned = std::move(PlanMemory(over)).value();
  EXPECT_LE(replanned.peak_bytes() + kMiB, budget);
  EXPECT_LT(replanned.peak_bytes(), plan.peak_bytes());
  const std::string table = MemoryPlanTable(plan);
  EXPECT_NE(table.find("rank layer  kind"), std::string::npos) << table;
  EXPECT_NE(table.find("predicted peak"), std::string::npos) << table;
}

// A plan's host buffers are what one step's offloads hold at once (one pass in flight here), and
// reserving them (Trainer::SetMemoryPlan) leaves the step nothing to pin.
// The planner counts the state a rank holds: under the distributed optimizer one shard of the
// masters and moments, so a budget that fits the sharded state keeps everything, and the same
// budget for a whole state needs offloading or recompute.
TEST_P(MemoryPlannerTest, SeesTheShardedStateOfTheDistributedOptimizer) {
  const GptConfig model = Model(GetParam());
  MemoryPlanRequest sharded = Request(model, 1e12);
  sharded.run.state_shards = 4;
  const MemoryPlan whole = std::move(PlanMemory(Request(model, 1e12))).value();
  const MemoryPlan quarter = std::move(PlanMemory(sharded)).value();
  const double saved = (StateBytesPerParameter(sharded.run.cuda, 1, sharded.run.dtypes) -
                        StateBytesPerParameter(sharded.run.cuda, 4, sharded.run.dtypes)) *
                       static_cast<double>(model.total_parameters());
  EXPECT_NEAR(whole.ranks[0].baseline_peak_bytes - quarter.ranks[0].baseline_peak_bytes, saved,
              1e-9 * saved);
  const double budget = quarter.ranks[0].baseline_peak_bytes / (1 - kPlanMargin);
  sharded.budget_bytes = budget;
  const MemoryPlan fits = std::move(PlanMemory(sharded)).value();
  EXPECT_TRUE(fits.offload.empty());
  for (const RecomputeModules& r : fits.recompute_by_layer) EXPECT_FALSE(r.any());
  // Without the sharding the same budget needs savings (CPU), or cannot be met at all (CUDA,
  // where sharding saves 9 of 18 bytes per parameter against 6 of 16 on the CPU).
  StatusOr<MemoryPlan> squeezed = PlanMemory(Request(model, budget));
  EXPECT_TRUE(!squeezed.ok() || !squeezed->SameChoices(fits));
}

TEST_P(MemoryPlannerTest, ReservesThePinnedBuffersItsOffloadsHold) {
  const GptConfig model = Model(GetParam());
  const TrainedRun reference = Train(model, nullptr);
  // The first budget down from the measured peak that offloading alone meets by offloading.
  MemoryPlan plan;
  for (double fraction = 0.99; fraction > 0.8; fraction -= 0.01) {
    MemoryPlanRequest request =
        Request(model, fraction * reference.steps.back().peak_device_mib[0] * kMiB);
    request.recompute_candidates.clear();
    StatusOr<MemoryPlan> planned = PlanMemory(request);
    if (!planned.ok() || planned->offload.empty()) continue;
    plan = std::move(planned).value();
    break;
  }
  ASSERT_FALSE(plan.offload.empty()) << "no budget planned an offload";
  double held = 0;
  for (const SavedTensorSize& s : plan.ranks[0].host_buffers) held += s.bytes;

  GptConfig planned = model;
  planned.recompute_by_layer = plan.recompute_by_layer;
  const auto source = Synthetic(model.vocab_size);
  auto trainer =
      std::move(Trainer::Create(planned, Options(planned, &plan), kDevice, source.get())).value();
  PinnedHostPool& pool = DeviceContext::Get(kDevice).pinned_pool();
  trainer->SetMemoryPlan(plan);
  const PinnedPoolStats before = pool.stats();
  const StepStats step = trainer->TrainStep();
  const PinnedPoolStats after = pool.stats();
  EXPECT_EQ(held * (kGlobal / kMicro), static_cast<double>(step.offload.offloaded_bytes));
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.unpooled_pins, before.unpooled_pins);
  EXPECT_GT(after.hits + after.unpooled_allocations, before.hits + before.unpooled_allocations);
  EXPECT_GT(step.copy_bytes_per_s, 0);

  // What the pool pins for them is what the pre-flight check (PlanPinnedBytes) counts.
  const std::set<std::string> unpooled = Options(planned, &plan).offload->unpooled_groups;
  std::vector<size_t> pooled_sizes, unpooled_sizes;
  for (const SavedTensorSize& s : plan.ranks[0].host_buffers) {
    (unpooled.count(s.group) ? unpooled_sizes : pooled_sizes)
        .push_back(static_cast<size_t>(s.bytes));
  }
  PinnedHostPool fresh(Device::CPU(), NewHostRawMemory());
  fresh.Reserve(pooled_sizes, unpooled_sizes);
  const PinnedPoolStats pinned = fresh.stats();
  EXPECT_EQ(static_cast<double>(pinned.pooled_reserved_bytes + pinned.unpooled_reserved_bytes),
            PlanPinnedBytes(plan, unpooled));
}

// A plan changed between steps (Trainer::SetMemoryPlan: what layers recompute and which groups
// they offload) trains bit for bit like no plan, and the steps after the change peak where the new
// plan predicts.
TEST_P(MemoryPlannerTest, APlanChangedBetweenStepsTrainsBitIdentically) {
  const GptConfig model = Model(GetParam());
  constexpr int kSteps = 4;
  const auto source = Synthetic(model.vocab_size);
  const auto run = [&](const MemoryPlan* first, const MemoryPlan* second) {
    GptConfig config = model;
    if (first != nullptr) config.recompute_by_layer = first->recompute_by_layer;
    CachingAllocator& allocator = DeviceContext::Get(kDevice).allocator();
    allocator.EmptyCache();
    auto trainer =
        std::move(Trainer::Create(config, Options(config, first), kDevice, source.get())).value();
    if (first != nullptr) trainer->SetMemoryPlan(*first);
    TrainedRun out;
    for (int step = 0; step < kSteps; ++step) {
      if (step == kSteps / 2 && second != nullptr) trainer->SetMemoryPlan(*second);
      out.steps.push_back(trainer->TrainStep());
    }
    for (const auto& p : trainer->parameters().all()) {
      out.weights.push_back(testing::FloatBits(p->master));
    }
    return out;
  };
  const TrainedRun reference = run(nullptr, nullptr);
  const double unplanned = reference.steps.back().peak_device_mib[0] * kMiB;
  // The lowest budget the planner meets (it recomputes), then one that only offloads.
  std::optional<MemoryPlan> low, offload_only;
  for (double fraction = 0.95; fraction > 0.5; fraction -= 0.05) {
    StatusOr<MemoryPlan> plan = PlanMemory(Request(model, fraction * unplanned));
    if (!plan.ok()) break;
    low = std::move(plan).value();
  }
  for (double fraction = 0.99; fraction > 0.8 && !offload_only; fraction -= 0.01) {
    MemoryPlanRequest request = Request(model, fraction * unplanned);
    request.recompute_candidates.clear();
    StatusOr<MemoryPlan> plan = PlanMemory(request);
    if (plan.ok() && !plan->offload.empty()) offload_only = std::move(plan).value();
  }
  ASSERT_TRUE(low && offload_only);
  ASSERT_FALSE(low->recompute_by_layer == offload_only->recompute_by_layer);
  const TrainedRun changed = run(&*low, &*offload_only);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(changed.steps[step].loss, reference.steps[step].loss) << step;
    EXPECT_EQ(changed.steps[step].grad_norm, reference.steps[step].grad_norm) << step;
  }
  EXPECT_EQ(changed.weights, reference.weights);
  const double measured = changed.steps.back().peak_device_mib[0] * kMiB;
  EXPECT_NEAR(offload_only->peak_bytes(), measured, std::max(0.05 * measured, kMiB));
  EXPECT_GT(measured, changed.steps.front().peak_device_mib[0] * kMiB) << "the plan did not change";
}

// Calibrated on a measured forward time, the time model predicts that time; measured copies
// replace the assumed rate.
TEST(MemoryPlannerCalibrationTest, CalibratedSpeedsPredictTheMeasuredForward) {
  MemoryPlanRequest request = Request(Model({GroupedMlpKind::kFused}), 1e12);
  const MemoryPlan assumed = std::move(PlanMemory(request)).value();
  const double predicted = assumed.ranks[0].forward_ms;
  ASSERT_GT(predicted, 0);
  request.speeds = CalibratedSpeeds(request.speeds, predicted, 3 * predicted, 1.5e9);
  EXPECT_EQ(request.speeds.copy_bytes_per_s, 1.5e9);
  const MemoryPlan calibrated = std::move(PlanMemory(request)).value();
  EXPECT_NEAR(calibrated.ranks[0].forward_ms, 3 * predicted, 1e-9 * predicted);
  const PlannerSpeeds kept = CalibratedSpeeds(request.speeds, 0, 0, 0);
  EXPECT_EQ(kept.matmul_flops_per_s, request.speeds.matmul_flops_per_s);
  EXPECT_EQ(kept.copy_bytes_per_s, 1.5e9);
}

TEST_P(MemoryPlannerTest, ABudgetNothingMeetsIsOneErrorWithTheShortfall) {
  const GptConfig model = Model(GetParam());
  const StatusOr<MemoryPlan> plan = PlanMemory(Request(model, 4 * kMiB));
  ASSERT_FALSE(plan.ok());
  const std::string& message = plan.status().message();
  EXPECT_NE(message.find("--memory_budget_gib=0.00390625: pipeline rank 0 needs at least"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("MiB more than the budget"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    GroupedMlps, MemoryPlannerTest,
    ::testing::Values(ExpertLayer{GroupedMlpKind::kFused}, ExpertLayer{GroupedMlpKind::kUnfused},
                      ExpertLayer{GroupedMlpKind::kFused, Fp8Recipe::kBlockwise}),
    [](const auto& info) {
      const ExpertLayer& e = info.param;
      return std::string(e.mlp == GroupedMlpKind::kFused ? "fused" : "unfused") +
             (e.fp8 == Fp8Recipe::kBlockwise ? "_fp8" : "");
    });

}  // namespace
}  // namespace moe
