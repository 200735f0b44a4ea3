// The benchmark apps as a user meets them: every flag is checked before any work, and a bad value
// is refused with exit code 2, nothing on stdout and one line on stderr naming the flag, with
// nothing created (apps/common/bench_flags.h). Sizes that do not fit end in one line and exit
// code 1. A good moe_bench run writes its JSON, with the block's routing (rows per expert), and
// prints the routing line the counts give.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"

namespace moe {
namespace {

using testing::ScopedTempDir;
using testing::SplitCommandResult;

struct BenchRefusal {
  std::string command;  // binary and arguments; $D is the test's directory
  std::string line;     // the one line on stderr, without its newline
};

void PrintTo(const BenchRefusal& refusal, std::ostream* os) { *os << refusal.command; }

std::string WithDir(std::string text, const std::string& dir) {
  for (size_t at = text.find("$D"); at != std::string::npos; at = text.find("$D", at + 1)) {
    text.replace(at, 2, dir);
  }
  return text;
}

class BenchRefusalTest : public ::testing::TestWithParam<BenchRefusal> {};

TEST_P(BenchRefusalTest, ExitsTwoWithOneLineNamingTheFlag) {
  const ScopedTempDir dir;
  const std::string command = WithDir(GetParam().command, dir.path());
  const SplitCommandResult r = testing::RunCommandSplit("cd " + dir.path() + " && " + command);
  EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.out << r.err;
  EXPECT_EQ(r.out, "") << command;
  EXPECT_EQ(r.err, WithDir(GetParam().line, dir.path()) + "\n") << command;
  EXPECT_EQ(dir.List(), std::vector<std::string>{}) << command;
}

const std::string kMoeBench = std::string(MOE_BENCH_BINARY) + " --device=cpu ";
const std::string kAttention = std::string(ATTENTION_BENCH_BINARY) + " --device=cpu ";
const std::string kOptimizer = std::string(OPTIMIZER_BENCH_BINARY) + " --device=cpu ";
const std::string kTokens = "must list one or more integers in [1, 1048576], comma-separated";
const std::string kShapes =
    "must list one or more of qwen3, mixtral, deepseek, tiny, comma-separated";

INSTANTIATE_TEST_SUITE_P(
    MoeBench, BenchRefusalTest,
    ::testing::Values(
        BenchRefusal{kMoeBench + "--tokens=abc", "moe_bench: --tokens=abc " + kTokens},
        BenchRefusal{kMoeBench + "--tokens=0", "moe_bench: --tokens=0 " + kTokens},
        BenchRefusal{kMoeBench + "--tokens=64,-5", "moe_bench: --tokens=64,-5 " + kTokens},
        BenchRefusal{kMoeBench + "--tokens=64,", "moe_bench: --tokens=64, " + kTokens},
        BenchRefusal{kMoeBench + "--tokens=64x", "moe_bench: --tokens=64x " + kTokens},
        BenchRefusal{kMoeBench + "--shapes=", "moe_bench: --shapes= " + kShapes},
        BenchRefusal{kMoeBench + "--shapes=tiny,gpt5", "moe_bench: --shapes=tiny,gpt5 " + kShapes},
        BenchRefusal{kMoeBench + "--paths=fused,cutlass",
                     "moe_bench: --paths=fused,cutlass must list one or more of fused, unfused, "
                     "fused_fp8, comma-separated"},
        BenchRefusal{kMoeBench + "--iters=0", "moe_bench: --iters=0 must be in [1, 1048576]"},
        BenchRefusal{kMoeBench + "--warmup=-1", "moe_bench: --warmup=-1 must be in [0, 1048576]"},
        BenchRefusal{kMoeBench + "--grads=fp8", "moe_bench: --grads=fp8 must be fp32 or bf16"},
        BenchRefusal{kMoeBench + "--json_out=$D/missing/out.json",
                     "moe_bench: --json_out $D/missing/out.json: directory $D/missing does not "
                     "exist"},
        BenchRefusal{kMoeBench + "--json_out=$D", "moe_bench: --json_out $D: not a regular file"},
        BenchRefusal{kMoeBench + "--device=tpu", "moe_bench: --device=tpu must be cpu or cuda"},
        // The command line, read as moe_train reads it (command_line.h).
        BenchRefusal{kMoeBench + "--iters=abc", "moe_bench: --iters=abc is not a valid int32"},
        BenchRefusal{kMoeBench + "--warmpu=3",
                     "moe_bench: unknown flag --warmpu (did you mean --warmup?)"},
        BenchRefusal{kMoeBench + "qwen3",
                     "moe_bench: unexpected argument 'qwen3' (flags are --name=value; a flagfile "
                     "is --flagfile=FILE)"},
        BenchRefusal{kMoeBench + "--flagfile=$D/none.flags",
                     "moe_bench: --flagfile=$D/none.flags: no such file"},
        // An item listed twice: a path checked against itself, a case timed twice (were run).
        BenchRefusal{kMoeBench + "--paths=fused,fused", "moe_bench: --paths lists fused twice"},
        BenchRefusal{kMoeBench + "--tokens=16,32,16", "moe_bench: --tokens lists 16 twice"},
        BenchRefusal{kMoeBench + "--shapes=tiny,qwen3,tiny",
                     "moe_bench: --shapes lists tiny twice"}));

INSTANTIATE_TEST_SUITE_P(
    AttentionBench, BenchRefusalTest,
    ::testing::Values(
        BenchRefusal{kAttention + "--seq=0", "attention_bench: --seq=0 must be in [1, 16777216]"},
        BenchRefusal{kAttention + "--batch=-1",
                     "attention_bench: --batch=-1 must be in [1, 1048576]"},
        BenchRefusal{kAttention + "--heads=16 --kv_heads=32",
                     "attention_bench: --kv_heads=32 must be in [1, 16]"},
        BenchRefusal{kAttention + "--heads=6 --kv_heads=4",
                     "attention_bench: --kv_heads=4 does not divide --heads=6"},
        BenchRefusal{kAttention + "--head_dim=96",
                     "attention_bench: --head_dim=96 must be 64 or 128"},
        BenchRefusal{kAttention + "--iters=0",
                     "attention_bench: --iters=0 must be in [1, 1048576]"},
        BenchRefusal{kAttention + "--seq=4k", "attention_bench: --seq=4k is not a valid int64"}));

INSTANTIATE_TEST_SUITE_P(
    OptimizerBench, BenchRefusalTest,
    ::testing::Values(BenchRefusal{kOptimizer + "--num_layers=0",
                                   "optimizer_bench: --num_layers=0 must be in [1, 1048576]"},
                      BenchRefusal{kOptimizer + "--num_layers=2 --first_dense_layers=3",
                                   "optimizer_bench: --first_dense_layers=3 must be in [0, 2]"},
                      BenchRefusal{kOptimizer + "--hidden_size=100 --num_attention_heads=16",
                                   "optimizer_bench: --hidden_size=100 is not a multiple of "
                                   "--num_attention_heads=16 (or set the head dimension with "
                                   "--kv_channels)"},
                      BenchRefusal{kOptimizer + "--copy_gib=nan",
                                   "optimizer_bench: --copy_gib=nan must be in [0.001, 1024]"},
                      // A copy of no element (was timed: nan% and inf% of its bandwidth).
                      BenchRefusal{kOptimizer + "--copy_gib=1e-300",
                                   "optimizer_bench: --copy_gib=1e-300 must be in [0.001, 1024]"},
                      BenchRefusal{kOptimizer + "--moments=fp16",
                                   "optimizer_bench: --moments=fp16 must be fp32 or bf16"},
                      BenchRefusal{kOptimizer + "--seq=3", "optimizer_bench: unknown flag --seq"}));

struct BenchOutOfMemory {
  std::string command;  // binary and arguments, run under a 1.5 GB address-space limit
  std::string program;
  std::string advice;  // how the one line ends
};

void PrintTo(const BenchOutOfMemory& run, std::ostream* os) { *os << run.command; }

class BenchOutOfMemoryTest : public ::testing::TestWithParam<BenchOutOfMemory> {};

// Sizes that pass the flag checks but not the machine end in one line naming what ran out and
// exit code 1, not an abort with a stack trace (apps/common/out_of_memory_exit.h).
TEST_P(BenchOutOfMemoryTest, IsOneLineAndExitOne) {
  const BenchOutOfMemory& run = GetParam();
  const SplitCommandResult r = testing::RunCommandSplit("ulimit -v 1500000 && " + run.command);
  EXPECT_EQ(r.exit_code, 1) << run.command << "\n" << r.out << r.err;
  EXPECT_EQ(r.err.rfind(run.program + ": out of ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const std::string ending = "; " + run.advice + "\n";
  ASSERT_GE(r.err.size(), ending.size()) << r.err;
  EXPECT_EQ(r.err.substr(r.err.size() - ending.size()), ending) << r.err;
}

INSTANTIATE_TEST_SUITE_P(
    Benches, BenchOutOfMemoryTest,
    ::testing::Values(
        // The DeepSeek-V3-like experts' weights: 22 GB.
        BenchOutOfMemory{kMoeBench + "--shapes=deepseek --tokens=4096 --paths=fused", "moe_bench",
                         "the benchmark does not fit (reduce --tokens or --shapes)"},
        // q alone: 2^20 tokens x 16 heads x 128 x 2 bytes = 4 GiB.
        BenchOutOfMemory{kAttention + "--seq=1048576", "attention_bench",
                         "the benchmark does not fit (reduce --batch, --seq or --heads)"},
        // A small model, then the copy's 1000 GiB source.
        BenchOutOfMemory{kOptimizer + "--num_layers=1 --hidden_size=64 --num_attention_heads=2 "
                                      "--num_query_groups=1 --num_experts=2 "
                                      "--moe_ffn_hidden_size=32 --vocab_size=64 --copy_gib=1000",
                         "optimizer_bench",
                         "the benchmark does not fit (reduce --copy_gib or the model's sizes)"},
        // Refused from the estimate before any tensor is made (making the tensors of a million
        // layers took minutes before an allocation failed).
        BenchOutOfMemory{kOptimizer + "--num_layers=1048576", "optimizer_bench",
                         "the benchmark does not fit (reduce --copy_gib or the model's sizes)"}));

// --help prints the bench's own flags (not every library's) and exits 0.
TEST(BenchHelpTest, HelpListsTheBenchsOwnFlags) {
  for (const std::string& bench : {kMoeBench, kAttention, kOptimizer}) {
    const SplitCommandResult r = testing::RunCommandSplit(bench + "--help");
    EXPECT_EQ(r.exit_code, 0) << bench << r.err;
    EXPECT_NE(r.out.find("    -device ("), std::string::npos) << bench << r.out;
    EXPECT_EQ(r.out.find("-logtostderr"), std::string::npos) << "glog's flags: " << bench;
  }
}

// A good run writes the JSON it was asked for: one entry per shape, token count and path.
TEST(MoeBenchTest, WritesItsJsonAtTheEnd) {
  const ScopedTempDir dir;
  const SplitCommandResult r = testing::RunCommandSplit(
      kMoeBench +
      "--shapes=tiny --tokens=32 --iters=1 --warmup=0 --json_out=" + dir.Path("bench.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(dir.Path("bench.json"));
  const nlohmann::json results = nlohmann::json::parse(in);
  ASSERT_EQ(results.size(), 2u) << results.dump();
  EXPECT_EQ(results[0]["shape"], "tiny");
  EXPECT_EQ(results[0]["tokens"], 32);
  EXPECT_EQ(results[0]["path"], "fused");
  EXPECT_EQ(results[1]["path"], "unfused");
  // The block's routing: one row count per expert (tiny: 8, top-2), 32 x 2 rows in all, the same
  // on both paths (one router, the same weights), and the table's routing line from those counts.
  const std::vector<int> rows = results[0]["rows_per_expert"].get<std::vector<int>>();
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(std::accumulate(rows.begin(), rows.end(), 0), 64);
  EXPECT_EQ(results[1]["rows_per_expert"].get<std::vector<int>>(), rows);
  std::vector<int> sorted = rows;
  std::sort(sorted.begin(), sorted.end());
  const std::string routing = "  routing: rows per expert min " + std::to_string(sorted.front()) +
                              ", median " + std::to_string(sorted[4]) + ", max " +
                              std::to_string(sorted.back()) +
                              "; 8 of 8 experts end in a row tile of <= 64 rows\n";
  EXPECT_NE(r.out.find(routing), std::string::npos) << r.out;

  // Its own earlier output is replaced; another file is refused and left as it was.
  const SplitCommandResult again = testing::RunCommandSplit(
      kMoeBench + "--shapes=tiny --tokens=32 --iters=1 --warmup=0 --paths=fused --json_out=" +
      dir.Path("bench.json"));
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  std::ifstream replaced(dir.Path("bench.json"));
  EXPECT_EQ(nlohmann::json::parse(replaced).size(), 1u);
  std::ofstream(dir.Path("notes.md")) << "# not a benchmark result\n";
  const SplitCommandResult refused = testing::RunCommandSplit(
      kMoeBench + "--shapes=tiny --tokens=32 --json_out=" + dir.Path("notes.md"));
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_EQ(refused.err, "moe_bench: --json_out " + dir.Path("notes.md") +
                             " exists and is not an output of this flag: refusing to replace it "
                             "(remove it, or name a new file)\n");
  std::ifstream kept(dir.Path("notes.md"));
  std::string first_line;
  std::getline(kept, first_line);
  EXPECT_EQ(first_line, "# not a benchmark result");
}

}  // namespace
}  // namespace moe
