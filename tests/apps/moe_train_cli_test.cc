// moe_train as a user meets it: a bad flag, file or checkpoint is one clear line naming it and a
// non-zero exit, before any work; a good run logs, writes metrics and checkpoints.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using Result = testing::CommandResult;

Result RunMoeTrain(const std::string& args) {
  return testing::RunCommand(std::string(MOE_TRAIN_BINARY) + " " + args);
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/cli_" + std::to_string(testing::TestSeed()) + "_" + name;
}

struct BadInput {
  std::string args;
  std::string message;  // must appear in the output
};

void PrintTo(const BadInput& input, std::ostream* os) { *os << input.args; }

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, ExitsNonZeroWithOneClearLine) {
  const Result r = RunMoeTrain("--device=cpu --train_steps=30 " + GetParam().args);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(GetParam().message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "work started: " << r.output;
  EXPECT_LE(std::count(r.output.begin(), r.output.end(), '\n'), 2) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, BadInputTest,
    ::testing::Values(
        BadInput{"--hidden_size=0", "--hidden_size=0 must be positive"},
        BadInput{"--hidden_size=66 --num_attention_heads=4", "--hidden_size=66 is not a multiple of --num_attention_heads=4"},
        BadInput{"--num_attention_heads=4 --num_query_groups=3", "--num_attention_heads=4 is not a multiple of --num_query_groups=3"},
        BadInput{"--moe_router_topk=5", "--moe_router_topk=5 exceeds --num_experts=4"},
        BadInput{"--moe_grouped_mlp=cutlass", "--moe_grouped_mlp=cutlass must be fused or unfused"},
        BadInput{"--first_dense_layers=3", "--first_dense_layers=3 must be in [0, --num_layers=2]"},
        BadInput{"--global_batch_size=12", "--global_batch_size=12 is not a multiple of --micro_batch_size=8"},
        BadInput{"--lr=-1", "--lr="},
        BadInput{"--min_lr=1", "--min_lr="},
        BadInput{"--warmup_steps=50", "--warmup_steps=50 must be in [0, --train_steps]"},
        BadInput{"--data_format=parquet", "--data_format=parquet must be"},
        BadInput{"--data_format=megatron", "--data_format=megatron needs --data_path"},
        BadInput{"--data_format=flat_u16 --data_path=/nonexistent/tokens.bin", "/nonexistent/tokens.bin"},
        BadInput{"--device=tpu", "--device=tpu must be cpu, cuda, cuda:N or auto"},
        BadInput{"--device=cuda:99", "--device=cuda:99"},
        BadInput{"--save_interval=5", "--save_interval needs --save"},
        BadInput{"--metrics_file=/nonexistent/dir/m.jsonl", "--metrics_file /nonexistent/dir/m.jsonl"},
        BadInput{"--load=/nonexistent/checkpoint", "/nonexistent/checkpoint"}));

TEST(MoeTrainTest, TokenIdsBeyondTheVocabularyAreRejected) {
  const std::string path = TempPath("tokens.u16");
  std::vector<uint16_t> tokens(5000, 3);
  tokens[1234] = 300;  // >= --vocab_size 256
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()),
                                               tokens.size() * sizeof(uint16_t));
  const Result r = RunMoeTrain("--device=cpu --data_format=flat_u16 --data_path=" + path);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("300"), std::string::npos) << r.output;
  std::filesystem::remove(path);
}

TEST(MoeTrainTest, RunsLogsWritesMetricsAndResumes) {
  const std::string metrics = TempPath("metrics.jsonl");
  const std::string root = TempPath("ckpt");
  std::filesystem::remove(metrics);
  std::filesystem::remove_all(root);
  const std::string common = "--device=cpu --log_interval=2 --eval_interval=4 --eval_steps=1 "
                             "--micro_batch_size=2 --global_batch_size=4 --warmup_steps=2 "
                             "--metrics_file=" + metrics + " --save=" + root;
  const Result first = RunMoeTrain(common + " --train_steps=4");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("parameters:"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("(fused grouped MLP)"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("entropy floor"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("tokens/s"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("validation loss"), std::string::npos) << first.output;
  EXPECT_TRUE(std::filesystem::exists(root + "/step_00000004/model.safetensors"));

  const Result resumed = RunMoeTrain(common + " --train_steps=6 --load=" + root);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step      6"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("step      2 "), std::string::npos) << "resume restarted: " << resumed.output;

  std::ifstream lines(metrics);
  std::string line;
  int records = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_TRUE(record.contains("step"));
    ++records;
  }
  EXPECT_EQ(records, 2 + 1 + 1 + 1);  // steps 2, 4; eval 4; step 6; eval 6
  std::filesystem::remove(metrics);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace moe
