// moe_train's offload flags as a user meets them: a bad combination is one line naming the
// flags and exit code 2 before any work; a good run prints the policy table after the first step
// and the offload traffic per log interval, also in --metrics_file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"
#include "tests/testing/moe_train_run.h"

namespace moe {
namespace {

using Result = testing::CommandResult;
using testing::BadInput;
using testing::RunMoeTrain;

class OffloadBadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(OffloadBadInputTest, ExitsWithOneClearLine) {
  testing::ExpectRefusedInOneLine(
      RunMoeTrain("--device=cpu --train_steps=5 --warmup_steps=1 " + GetParam().args),
      GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, OffloadBadInputTest,
    ::testing::Values(
        BadInput{"--offload_modules=core_attn,ffn", "--offload_modules: unknown module \"ffn\""},
        BadInput{"--offload_modules=attn_proj", "attn_proj needs core_attn"},
        BadInput{"--moe_grouped_mlp=unfused --offload_modules=fused_group_mlp",
                 "--offload_modules=fused_group_mlp needs --moe_grouped_mlp=fused"},
        BadInput{"--moe_grouped_mlp=fused --offload_modules=expert_fc1",
                 "--offload_modules=expert_fc1 does not exist with --moe_grouped_mlp=fused"},
        BadInput{"--moe_grouped_mlp=fused --offload_modules=fused_group_mlp,moe_act",
                 "fused_group_mlp cannot be combined with moe_act"},
        BadInput{"--offload_modules=core_attn --offload_fraction=1.5",
                 "--offload_fraction=1.5 must be in [0, 1]"},
        BadInput{"--offload_modules=core_attn --offload_prefetch_layers=9",
                 "--offload_prefetch_layers=9 must be in [0, --num_layers=2]"}));

TEST(OffloadCliTest, ReportsThePolicyAndTheTraffic) {
  const testing::ScopedTempDir dir;
  const std::string metrics = dir.Path("metrics.jsonl");
  const Result r = RunMoeTrain(
      "--device=cpu --moe_grouped_mlp=unfused --train_steps=3 --warmup_steps=1 --log_interval=1 "
      "--eval_interval=0 "
      "--offload_modules=core_attn,expert_fc1,moe_act --offload_min_tensor_bytes=0 "
      "--metrics_file=" +
      metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("offload: core_attn, expert_fc1, moe_act (tensors >= 0 bytes"),
            std::string::npos)
      << r.output;
  // The table, once, after the first step: rank, group, offloaded/candidate groups, tensors.
  EXPECT_NE(r.output.find("warm-up step moved"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("core_attn              2/2        8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expert_fc1             1/1        1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("moe_act                1/1        2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unpooled (routed shapes)"), std::string::npos) << r.output;
  size_t tables = 0;
  for (size_t at = r.output.find("warm-up step moved"); at != std::string::npos;
       at = r.output.find("warm-up step moved", at + 1)) {
    ++tables;
  }
  EXPECT_EQ(tables, 1u) << r.output;
  EXPECT_NE(r.output.find("offload | out"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reload wait"), std::string::npos) << r.output;

  const std::vector<nlohmann::json> records = testing::StepRecords(metrics);
  EXPECT_EQ(records.size(), 3u);
  for (const nlohmann::json& record : records) {
    for (const char* key : {"offload_bytes_per_step", "reload_bytes_per_step", "offload_d2h_gbps",
                            "offload_h2d_gbps", "offload_wait_ms"}) {
      EXPECT_TRUE(record.contains(key)) << key << " in " << record;
    }
    EXPECT_GT(record["offload_bytes_per_step"].get<double>(), 0) << record;
    EXPECT_EQ(record["offload_bytes_per_step"], record["reload_bytes_per_step"]) << record;
    EXPECT_GT(record["offload_d2h_gbps"].get<double>(), 0) << record;
  }
}

}  // namespace
}  // namespace moe
