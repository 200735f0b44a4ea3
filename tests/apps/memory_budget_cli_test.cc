// moe_train's --memory_budget_gib as a user meets it: a bad value or combination, or a budget
// nothing can meet, is one line naming the flag and exit code 2 before any work; a good run
// prints the plan table once, trains under the budget, and logs the predicted and measured peak
// on each line and in --metrics_file, the prediction within 5% of the measurement.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"
#include "tests/testing/moe_train_run.h"

namespace moe {
namespace {

using Result = testing::CommandResult;
using testing::BadInput;
using testing::RunMoeTrain;

class MemoryBudgetBadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(MemoryBudgetBadInputTest, ExitsWithOneClearLine) {
  testing::ExpectRefusedInOneLine(
      RunMoeTrain("--device=cpu --train_steps=5 --warmup_steps=1 " + GetParam().args),
      GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, MemoryBudgetBadInputTest,
    ::testing::Values(
        BadInput{"--memory_budget_gib=-1", "--memory_budget_gib=-1 must be in [0, 1048576]"},
        BadInput{
            "--memory_budget_gib=100000",
            "--memory_budget_gib=100000 is more than a rank can have: cpu (physical memory) has"},
        BadInput{"--memory_budget_gib=0.001",
                 "--memory_budget_gib=0.001: pipeline rank 0 needs at least"},
        BadInput{"--offload_modules=auto", "--offload_modules=auto needs --memory_budget_gib"},
        BadInput{"--recompute_modules=auto", "--recompute_modules=auto needs --memory_budget_gib"},
        BadInput{"--memory_budget_gib=1 --offload_fraction=0.5",
                 "--offload_fraction=0.5 needs no --memory_budget_gib"},
        BadInput{"--memory_budget_gib=1 --recompute_modules=moe --recompute_num_layers=1",
                 "--recompute_num_layers=1 needs no --memory_budget_gib"},
        BadInput{"--memory_budget_gib=1 --offload_modules=attn_proj", "attn_proj needs core_attn"},
        BadInput{"--memory_budget_gib=1 --recompute_modules=moe,ffn",
                 "--recompute_modules: unknown module \"ffn\""}));

TEST(MemoryBudgetCliTest, PlansOnceAndTrainsUnderTheBudget) {
  const testing::ScopedTempDir dir;
  const std::string metrics = dir.Path("metrics.jsonl");
  // The default model with 4 layers at micro-batch 16 peaks at 48 MiB keeping everything.
  const double budget_mib = 38;
  const Result r = RunMoeTrain(
      "--device=cpu --train_steps=3 --warmup_steps=1 --log_interval=1 --eval_interval=0 "
      "--num_layers=4 --micro_batch_size=16 --global_batch_size=32 --offload_min_tensor_bytes=0 "
      "--memory_budget_gib=" +
      std::to_string(budget_mib / 1024) + " --metrics_file=" + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t tables = 0;
  for (size_t at = r.output.find("memory plan for a budget"); at != std::string::npos;
       at = r.output.find("memory plan for a budget", at + 1)) {
    ++tables;
  }
  // Printed at the start, and again when the calibration on step 2 changed the plan.
  const size_t calibrated = r.output.find("memory plan calibrated on this step: forward ");
  ASSERT_NE(calibrated, std::string::npos) << r.output;
  EXPECT_LT(r.output.find("step      2 |"), calibrated) << r.output;
  EXPECT_GT(r.output.find("step      3 |"), calibrated) << r.output;
  const bool replanned = r.output.find("; re-planned", calibrated) != std::string::npos;
  EXPECT_EQ(tables, replanned ? 2u : 1u) << r.output;
  EXPECT_NE(r.output.find("rank layer  kind      candidate"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0: predicted peak"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("budget 38 MiB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" offload         "), std::string::npos)
      << "nothing planned: " << r.output;

  const std::vector<nlohmann::json> records = testing::StepRecords(metrics);
  EXPECT_EQ(records.size(), 3u);
  for (const nlohmann::json& record : records) {
    const double measured = record["peak_device_mib"].get<double>();
    const double predicted = record["predicted_peak_device_mib"].get<double>();
    EXPECT_LE(measured, budget_mib) << record;
    EXPECT_NEAR(predicted, measured, 0.05 * measured) << record;
  }
}

}  // namespace
}  // namespace moe
