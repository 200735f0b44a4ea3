// moe_train under mpirun, as a user meets it: a world size or layout that does not fit, a flag
// whose feature is off, a run too large for the host, or a --save holding another run's
// checkpoints is one clear line from every rank and exit code 2 of the whole job (no hang, no
// work); a non-finite loss stops every rank before the step is saved; a good pipeline-parallel
// run logs once (rank 0) and reports the single-process losses, and one process resumes from its
// checkpoint; so does a run under the distributed optimizer, whose log says the state per rank. A
// plain (label cpu) test, as it starts mpirun itself. Every test that writes files works in a
// temporary directory of its own.
#include <gtest/gtest.h>

#include "tests/testing/command.h"
#include "tests/testing/moe_train_run.h"
#include "tests/testing/safetensors_edit.h"

#if MOE_WITH_MPI

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe {
namespace {

using Result = testing::CommandResult;  // output: stdout and stderr of every rank

// `timeout` turns a hang into exit code 124 rather than a stuck test.
Result RunMoeTrain(int ranks, const std::string& args) {
  const std::string launcher =
      ranks == 0
          ? std::string()
          : "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np " +
                std::to_string(ranks) + " --oversubscribe ";
  const std::string command = launcher + MOE_TRAIN_BINARY +
                              " --device=cpu --train_steps=2 --warmup_steps=1 --log_interval=1 "
                              "--num_layers=4 --hidden_size=32 --seq_length=16 --eval_steps=1 " +
                              args;
  return testing::RunCommand(command);
}

int Count(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

struct BadLayout {
  int ranks;
  std::string args;
  std::string message;  // every rank prints it
};

void PrintTo(const BadLayout& layout, std::ostream* os) {
  *os << "-np " << layout.ranks << " " << layout.args;
}

class BadLayoutTest : public ::testing::TestWithParam<BadLayout> {};

TEST_P(BadLayoutTest, EveryRankExitsNonZeroWithTheMessage) {
  const BadLayout& layout = GetParam();
  const Result r = RunMoeTrain(layout.ranks, layout.args);
  EXPECT_EQ(r.exit_code, 2) << r.output;  // main.cc: flags are exit code 2 (124: the job hung)
  EXPECT_EQ(Count(r.output, layout.message), layout.ranks) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "work started: " << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, BadLayoutTest,
    ::testing::Values(
        BadLayout{3, "--pipeline_parallel=2",
                  "moe_train: --pipeline_parallel=2 does not divide 3 ranks (rank 0; 3 of 3 ranks "
                  "failed)"},
        BadLayout{2, "--pipeline_parallel=2 --num_layers=3",
                  "--num_layers=3 does not split evenly over 2 pipeline stages"},
        BadLayout{4, "--pipeline_parallel=4 --num_layers=2",
                  "--num_layers=2 is fewer than the 4 pipeline stages"},
        BadLayout{2, "--pipeline_parallel=2 --virtual_pipeline=3 --num_layers=8",
                  "--num_layers=8 does not split evenly over 6 pipeline stages"},
        BadLayout{2, "--global_batch_size=8 --micro_batch_size=8",
                  "--global_batch_size=8 is not a multiple of --micro_batch_size=8 x data-parallel "
                  "size 2"},
        // The rule table's row for ranks (apps/moe_train/flag_rules.cc).
        BadLayout{2, "--device=cuda:1",
                  "moe_train: --device=cuda:1 needs one process: under mpirun each rank takes the "
                  "GPU of its local rank: use --device=cuda (rank 0; 2 of 2 ranks failed)"},
        BadLayout{2, "--virtual_pipeline=2",
                  "--virtual_pipeline=2 needs --pipeline_parallel > 1: chunks interleave across "
                  "pipeline ranks"},
        BadLayout{2, "configs/tiny.flags", "unexpected argument 'configs/tiny.flags'"},
        BadLayout{2, "--pipeline_parallel=2 --seq_length=1000000", "the run needs at least about "},
        // Expert parallelism: E divides the data-parallel size and --num_experts, and needs MoE
        // layers.
        BadLayout{4, "--pipeline_parallel=2 --expert_model_parallel_size=4",
                  "--expert_model_parallel_size=4 does not divide the data-parallel size 2 (4 "
                  "ranks / --pipeline_parallel=2)"},
        BadLayout{3, "--expert_model_parallel_size=3",
                  "--expert_model_parallel_size=3 does not divide --num_experts=4"},
        BadLayout{2, "--expert_model_parallel_size=2 --first_dense_layers=4",
                  "--expert_model_parallel_size=2 needs MoE layers (--first_dense_layers=4 of "
                  "--num_layers=4)"}));

std::vector<std::string> LossLines(const std::string& output) {
  static const std::regex kLoss(R"(step +\d+ \| loss [0-9.]+ \| aux [0-9.]+)");
  std::vector<std::string> lines;
  for (std::sregex_iterator it(output.begin(), output.end(), kLoss), end; it != end; ++it) {
    lines.push_back(it->str());
  }
  return lines;
}

TEST(ParallelRunTest, PipelineAndDataParallelRunsLogOnceWithTheSingleProcessLosses) {
  const Result single = RunMoeTrain(0, "");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const std::vector<std::string> expected = LossLines(single.output);
  ASSERT_EQ(expected.size(), 2u) << single.output;
  for (const std::string layout :
       {"--pipeline_parallel=2", "--pipeline_parallel=1", "--expert_model_parallel_size=2"}) {
    const Result r = RunMoeTrain(2, layout);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(LossLines(r.output), expected) << r.output;
    if (layout.starts_with("--expert")) {
      EXPECT_EQ(
          Count(r.output, "data 2, expert parallel 2 (2 of 4 experts per rank, expert-data 1)"), 1)
          << r.output;
      // One load line per log line: rows routed per expert and received per rank, bytes sent.
      EXPECT_EQ(Count(r.output, "experts | rows per expert min "), 2) << r.output;
      EXPECT_EQ(Count(r.output, "| rows per rank min "), 2) << r.output;
      EXPECT_EQ(Count(r.output, "| busiest rank of an exchange "), 2) << r.output;
    }
    EXPECT_EQ(Count(r.output, "moe_train: cpu"), 1) << r.output;
    EXPECT_EQ(Count(r.output, "eval step"), 1) << r.output;
  }
}

// --use_distributed_optimizer: the log says the state a rank holds (CPU: 8 + 8 / 2 bytes per
// parameter), the losses are the single process's, and one process resumes from its checkpoint
// with the next loss; with one process the flag is the degenerate case, noted and unchanged.
TEST(ParallelRunTest, DistributedOptimizerRunsLikeOneProcessAndOneResumesFromItsCheckpoint) {
  const Result single = RunMoeTrain(0, "");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const std::vector<std::string> expected = LossLines(single.output);
  ASSERT_EQ(expected.size(), 2u) << single.output;
  EXPECT_EQ(Count(single.output, "16 bytes/parameter on each rank:"), 1) << single.output;

  const testing::ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const Result sharded =
      RunMoeTrain(2, "--use_distributed_optimizer --save_interval=1 --save=" + root);
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  EXPECT_EQ(LossLines(sharded.output), expected) << sharded.output;
  EXPECT_EQ(Count(sharded.output,
                  "weights+grads+optimizer 12 bytes/parameter on each rank "
                  "(master weights and moments sharded over 2 data ranks)"),
            1)
      << sharded.output;
  const Result resumed = RunMoeTrain(0, "--load=" + root + "/step_00000001");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(LossLines(resumed.output), std::vector<std::string>{expected[1]}) << resumed.output;

  const Result degenerate = RunMoeTrain(0, "--use_distributed_optimizer");
  ASSERT_EQ(degenerate.exit_code, 0) << degenerate.output;
  EXPECT_EQ(LossLines(degenerate.output), expected) << degenerate.output;
  EXPECT_EQ(Count(degenerate.output, "--use_distributed_optimizer with one data-parallel rank"), 1)
      << degenerate.output;
}

int CountMatches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// Rank 0 prints the offload policy once, with the rows of every pipeline rank (2 layers each).
TEST(ParallelRunTest, OffloadPolicyTableHasEveryPipelineRank) {
  const Result r = RunMoeTrain(2,
                               "--pipeline_parallel=2 --offload_min_tensor_bytes=0 "
                               "--offload_modules=attn_norm,qkv_linear,core_attn");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Count(r.output, "offload: warm-up step moved"), 1) << r.output;
  for (const std::string rank : {"0", "1"}) {
    for (const std::string group : {"attn_norm", "qkv_linear", "core_attn"}) {
      EXPECT_EQ(CountMatches(r.output, "\\n +" + rank + "  " + group + " +2/2 "), 1)
          << "rank " << rank << ", " << group << ":\n"
          << r.output;
    }
    EXPECT_EQ(CountMatches(r.output, "\\n +" + rank + "  total +6/6 "), 1) << r.output;
  }
}

// --memory_budget_gib plans each pipeline rank (1F1B: rank 0 holds two micro-batches, rank 1
// one): each rank's measured peak is under the budget and within 5% of its prediction (the
// prediction of the plan the step ran with).
TEST(ParallelRunTest, MemoryPlanPredictsEveryPipelineRanksPeak) {
  const testing::ScopedTempDir dir;
  const std::string metrics = dir.Path("metrics.jsonl");
  const double budget_mib = 41;  // keeping everything: 76 and 51 MiB
  const Result r =
      RunMoeTrain(2,
                  "--pipeline_parallel=2 --num_layers=8 --hidden_size=128 --seq_length=64 "
                  "--micro_batch_size=16 --global_batch_size=64 --offload_min_tensor_bytes=0 "
                  "--memory_budget_gib=" +
                      std::to_string(budget_mib / 1024) + " --metrics_file=" + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Printed at the start, and again if the calibration on step 2 changed the plan.
  const int tables = 1 + Count(r.output, "; re-planned");
  EXPECT_EQ(Count(r.output, "memory plan for a budget"), tables) << r.output;
  EXPECT_EQ(Count(r.output, ": predicted peak"), 2 * tables) << r.output;
  const std::vector<nlohmann::json> records = testing::StepRecords(metrics);
  EXPECT_EQ(records.size(), 2u);
  for (const nlohmann::json& record : records) {
    const auto measured = record["peak_device_mib_by_rank"].get<std::vector<double>>();
    const auto predicted =
        record["predicted_peak_device_mib_by_pipeline_rank"].get<std::vector<double>>();
    ASSERT_EQ(measured.size(), 2u) << record;
    ASSERT_EQ(predicted.size(), 2u) << record;
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_LE(measured[rank], budget_mib) << "rank " << rank << ": " << record;
      EXPECT_NEAR(predicted[rank], measured[rank], 0.05 * measured[rank])
          << "rank " << rank << ": " << record;
    }
  }
}

// A checkpoint saved by a pipeline run is the full model: one process resumes from it and logs
// the pipeline run's next loss.
TEST(ParallelRunTest, OneProcessResumesFromAPipelineCheckpoint) {
  const testing::ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const Result pipelined = RunMoeTrain(2, "--pipeline_parallel=2 --save_interval=1 --save=" + root);
  ASSERT_EQ(pipelined.exit_code, 0) << pipelined.output;
  EXPECT_EQ(Count(pipelined.output, "saved checkpoint"), 2) << pipelined.output;
  const std::vector<std::string> losses = LossLines(pipelined.output);
  ASSERT_EQ(losses.size(), 2u) << pipelined.output;
  const Result resumed = RunMoeTrain(0, "--load=" + root + "/step_00000001");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(LossLines(resumed.output), std::vector<std::string>{losses[1]}) << resumed.output;
}

// Every rank stops at the first non-finite loss, with one line, before saving that step.
TEST(ParallelRunTest, ANonFiniteLossStopsEveryRankBeforeItIsSaved) {
  const testing::ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const Result first = RunMoeTrain(0, "--train_steps=1 --save=" + root);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Finite but huge (a checkpoint's NaN is refused at load): the logits overflow.
  ASSERT_GT(testing::OverwriteF32Tensors(root + "/step_00000001/model.safetensors", "final_norm",
                                         3.4e38f),
            0);
  const std::vector<std::string> before = dir.List();
  const Result r = RunMoeTrain(2,
                               "--pipeline_parallel=2 --train_steps=3 --save_interval=1 "
                               "--load=" +
                                   root + " --save=" + root);
  EXPECT_EQ(r.exit_code, 1) << r.output;  // main.cc: a runtime error is exit code 1
  EXPECT_EQ(Count(r.output,
                  "moe_train: step 2: loss is nan, gradient norm is nan; stopped before "
                  "saving anything of it"),
            2)
      << r.output;
  EXPECT_EQ(Count(r.output, "saved checkpoint"), 0) << r.output;
  EXPECT_EQ(dir.List(), before);
}

// A second job into the same --save without --load is refused on every rank, before any work.
TEST(ParallelRunTest, ASecondRunIntoTheSameSaveIsRefusedOnEveryRank) {
  const testing::ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const Result first = RunMoeTrain(0, "--train_steps=1 --save=" + root);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::vector<std::string> before = dir.List();
  const Result r = RunMoeTrain(2, "--pipeline_parallel=2 --save=" + root);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(Count(r.output, "--save " + root +
                                " already holds checkpoints (up to step_00000001); "
                                "resume with --load=" +
                                root),
            2)
      << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "work started: " << r.output;
  EXPECT_EQ(dir.List(), before);
}

}  // namespace
}  // namespace moe
#endif  // MOE_WITH_MPI
