// moe_train --dry_run as a user meets it (apps/moe_train/dry_run.h): its figures are the start-up
// estimate a real run of the same flags prints (one process, and under mpirun a pipeline of two)
// and its plan the plan that run makes; a 64-rank layout prints one line per pipeline rank and a
// verdict, quickly, with no GPU and no mpirun; a layout that does not fit is a result (exit 0)
// naming the smallest change that fits (a larger --expert_model_parallel_size among them: each
// rank's figures shrink with it); a flag or layout a run refuses is the same one line and
// exit code 2; files the flags name are not looked at; --dry_run_json is the same report. A plain
// (label cpu) test: it starts mpirun itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"
#include "tests/testing/source_tree.h"

namespace moe {
namespace {

using testing::CommandResult;
using testing::SplitCommandResult;

const std::string kConfigs = testing::ConfigPath();

const std::string kSmallRun =
    "--device=cpu --train_steps=1 --warmup_steps=1 --eval_interval=0 --eval_steps=1 ";

// The real run: one process (`ranks` 0) or under mpirun.
CommandResult RealRun(int ranks, const std::string& args) {
  const std::string launcher =
      ranks == 0
          ? std::string()
          : "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np " +
                std::to_string(ranks) + " --oversubscribe ";
  return testing::RunCommand(launcher + MOE_TRAIN_BINARY + " " + args);
}

SplitCommandResult DryRun(const std::string& args) {
  return testing::RunCommandSplit(std::string(MOE_TRAIN_BINARY) + " --dry_run " + args);
}

// The lines of `text` that start with `prefix`, in order.
std::vector<std::string> Lines(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, prefix.size(), prefix) == 0) out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

std::string Line(const std::string& text, const std::string& prefix) {
  const std::vector<std::string> lines = Lines(text, prefix);
  return lines.empty() ? "(no line starting with '" + prefix + "')" : lines.front();
}

// The dry run's figures and summary lines are those the run prints at start: its "memory:" line
// (the estimate it checks), model, batch and parameter counts.
void ExpectTheRunsEstimate(int ranks, const std::string& args) {
  const CommandResult run = RealRun(ranks, kSmallRun + args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const SplitCommandResult dry =
      DryRun(kSmallRun + args + " --dry_run_world_size=" + std::to_string(std::max(ranks, 1)));
  ASSERT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  EXPECT_EQ(dry.err, "");
  ASSERT_EQ(Lines(run.output, "memory: estimated").size(), 1u) << "rank 0 only: " << run.output;
  EXPECT_EQ(Line(dry.out, "memory: estimated"), Line(run.output, "memory: estimated")) << args;
  for (const std::string prefix : {"model: ", "batch: "}) {
    EXPECT_EQ(Line(dry.out, prefix), Line(run.output, prefix)) << args;
  }
  EXPECT_EQ(Line(run.output, "parameters: ").rfind(Line(dry.out, "parameters: ") + ";", 0), 0u)
      << run.output << dry.out;
  EXPECT_EQ(
      Line(dry.out, "dry run: ").find("dry run: " + Line(run.output, "parallel: ").substr(10)), 0u)
      << run.output << dry.out;
}

TEST(DryRunCliTest, FiguresAreTheStartUpEstimateOfTheSameRun) {
  ExpectTheRunsEstimate(0, "");
  ExpectTheRunsEstimate(0,
                        "--num_layers=4 --micro_batch_size=4 --global_batch_size=16 "
                        "--recompute_modules=layernorm,core_attn --main_grads_dtype=bf16 "
                        "--exp_avg_dtype=bf16 --moe_wgrad_micro_batches=2");
}

#if MOE_WITH_MPI
TEST(DryRunCliTest, FiguresAreTheStartUpEstimateOfAPipelineUnderMpirun) {
  ExpectTheRunsEstimate(2, "--num_layers=4 --pipeline_parallel=2 --global_batch_size=32");
  ExpectTheRunsEstimate(2, "--num_layers=4 --global_batch_size=32 --use_distributed_optimizer");
  ExpectTheRunsEstimate(2,
                        "--num_layers=4 --global_batch_size=32 --use_distributed_optimizer "
                        "--expert_model_parallel_size=2");
}
#endif

// With --memory_budget_gib the dry run prints the plan the run makes at start: each pipeline
// rank's predicted peak and cost.
TEST(DryRunCliTest, PlanIsTheRunsPlan) {
  const std::string args =
      "--num_layers=4 --micro_batch_size=16 --global_batch_size=32 --offload_min_tensor_bytes=0 "
      "--memory_budget_gib=0.037109375";  // 38 MiB of 48 (memory_budget_cli_test.cc)
  const CommandResult run = RealRun(0, kSmallRun + args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const SplitCommandResult dry = DryRun(kSmallRun + args);
  ASSERT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  const std::string rank_line = "  rank 0: predicted peak";
  EXPECT_EQ(Line(dry.out, rank_line), Line(run.output, rank_line)) << run.output << dry.out;
  EXPECT_EQ(Lines(dry.out, "          offload ").size(), 1u) << "nothing offloaded: " << dry.out;
  EXPECT_EQ(Line(dry.out, "verdict: ").rfind("verdict: fits in 80 GiB (80.0 GiB usable) with ", 0),
            0u)
      << dry.out;
}

// The example: a 64-rank layout of a preset, one line per pipeline rank (its layers, the
// embedding on the first, the head on the last; 1F1B's first rank holds 8 micro-batches), the
// estimate, the plan per rank and the verdict; no mpirun, no GPU (--device=auto means one).
TEST(DryRunCliTest, A64RankLayoutPrintsEveryPipelineRank) {
  const SplitCommandResult r =
      DryRun("--flagfile=" + kConfigs +
             "/moe_100m.flags --dry_run_world_size=64 --pipeline_parallel=8 "
             "--global_batch_size=512 --micro_batch_size=4 --memory_budget_gib=0.8");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Line(r.out, "dry run: ")
                .rfind("dry run: 64 ranks = pipeline 8 x data 8; 1 chunk(s) "
                       "per pipeline rank, schedule 1f1b; cuda:0, bf16",
                       0),
            0u)
      << r.out;
  const std::vector<std::string> rows = {Line(r.out, "     0  emb 0 "), Line(r.out, "     1  1 "),
                                         Line(r.out, "     6  6 "), Line(r.out, "     7  7 head ")};
  for (const std::string& row : rows) EXPECT_EQ(row.find("(no line"), std::string::npos) << r.out;
  EXPECT_NE(rows[0].find("          8  "), std::string::npos) << rows[0];  // in flight
  EXPECT_NE(rows[3].find("          1  "), std::string::npos) << rows[3];
  EXPECT_EQ(Lines(r.out, "  rank ").size(), 8u + 1) << "header and 8 plan ranks: " << r.out;
  EXPECT_EQ(Lines(r.out, "memory: estimated ").size(), 1u) << r.out;
  EXPECT_EQ(Lines(r.out, "verdict: fits in 80 GiB (78.4 GiB usable) with ").size(), 1u) << r.out;
}

// Not fitting is the answer, not an error: exit 0, what it needs, and the first single change
// that fits (here the distributed optimizer, over 8 data-parallel ranks).
TEST(DryRunCliTest, ALayoutThatDoesNotFitIsAResultWithTheSmallestChange) {
  const std::string qwen_shaped =
      "--num_layers=48 --hidden_size=2048 --num_attention_heads=32 --num_query_groups=4 "
      "--num_experts=128 --moe_router_topk=8 --moe_ffn_hidden_size=768 --first_dense_layers=0 "
      "--seq_length=4096 --vocab_size=151936 --micro_batch_size=1 --global_batch_size=512 ";
  SplitCommandResult r = DryRun(qwen_shaped + "--dry_run_world_size=64 --pipeline_parallel=8");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Line(r.out, "verdict: ").rfind("verdict: does not fit in 80 GiB: needs ", 0), 0u)
      << r.out;
  EXPECT_NE(r.out.find("; smallest change that fits: --use_distributed_optimizer (then "),
            std::string::npos)
      << r.out;
  r = DryRun(qwen_shaped +
             "--dry_run_world_size=64 --pipeline_parallel=8 --use_distributed_optimizer "
             "--dry_run_device_memory_gib=141");
  EXPECT_EQ(Line(r.out, "verdict: ").rfind("verdict: fits in 141 GiB (138.2 GiB usable) with ", 0),
            0u)
      << r.out;
  // One process, too big for anything one flag can do.
  r = DryRun(qwen_shaped);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(Line(r.out, "verdict: ").find("; no single change of "), std::string::npos) << r.out;
}

// --expert_model_parallel_size=E: each rank holds 1 / E of the experts (the Qwen-shaped model's
// experts are most of it), so its parameters, weights and gradients shrink; under the distributed
// optimizer over 8 data ranks its optimizer state stays (1 / E of the experts, sharded over 8 / E
// ranks); its activations grow (the expert rows' margin) and then stay. Where the state does not
// fit, the smallest E that fits is the change named.
TEST(DryRunCliTest, ExpertParallelShrinksEachRanksStateAndIsAChangeThatFits) {
  const std::string qwen_shaped =
      "--num_layers=48 --hidden_size=2048 --num_attention_heads=32 --num_query_groups=4 "
      "--num_experts=128 --moe_router_topk=8 --moe_ffn_hidden_size=768 --first_dense_layers=0 "
      "--seq_length=4096 --vocab_size=151936 --micro_batch_size=1 --global_batch_size=512 "
      "--dry_run_world_size=64 --pipeline_parallel=8 --use_distributed_optimizer ";
  const SplitCommandResult whole = DryRun(qwen_shaped + "--dry_run_json");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  nlohmann::json previous = nlohmann::json::parse(whole.out);
  EXPECT_EQ(previous["expert_parallel"], 1);
  for (const int e : {2, 8}) {
    const SplitCommandResult split =
        DryRun(qwen_shaped + "--dry_run_json --expert_model_parallel_size=" + std::to_string(e));
    ASSERT_EQ(split.exit_code, 0) << split.out << split.err;
    const nlohmann::json report = nlohmann::json::parse(split.out);
    EXPECT_EQ(report["expert_parallel"], e);
    ASSERT_EQ(report["ranks"].size(), 8u);
    for (size_t rank = 0; rank < 8; ++rank) {
      const nlohmann::json& a = previous["ranks"][rank];
      const nlohmann::json& b = report["ranks"][rank];
      EXPECT_LT(b["parameters"].get<double>(), a["parameters"].get<double>()) << e;
      EXPECT_LT(b["weight_bytes"].get<double>(), a["weight_bytes"].get<double>()) << e;
      EXPECT_LT(b["gradient_bytes"].get<double>(), a["gradient_bytes"].get<double>()) << e;
      EXPECT_EQ(b["optimizer_bytes"].get<double>(), a["optimizer_bytes"].get<double>()) << e;
      EXPECT_GE(b["activation_bytes"].get<double>(), a["activation_bytes"].get<double>()) << e;
      EXPECT_LT(b["total_bytes"].get<double>(), a["total_bytes"].get<double>()) << e;
    }
    previous = report;
  }
  const SplitCommandResult r = DryRun(qwen_shaped + "--dry_run_device_memory_gib=40");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(Line(r.out, "verdict: ").rfind("verdict: does not fit in 40 GiB: needs ", 0), 0u)
      << r.out;
  EXPECT_NE(r.out.find("; smallest change that fits: --expert_model_parallel_size=4 (then "),
            std::string::npos)
      << r.out;
}

// A flag or layout the run refuses is the same one line (without the ranks' agreement suffix a
// run under mpirun adds), exit code 2, nothing on stdout.
struct Refused {
  std::string args;
  std::string line;  // after "moe_train: "
};

void PrintTo(const Refused& refused, std::ostream* os) { *os << refused.args; }

class DryRunRefusalTest : public ::testing::TestWithParam<Refused> {};

TEST_P(DryRunRefusalTest, ExitsTwoWithTheRunsLine) {
  const SplitCommandResult r = DryRun(GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "moe_train: " + GetParam().line + "\n");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DryRunRefusalTest,
    ::testing::Values(
        Refused{"--dry_run_world_size=3 --pipeline_parallel=2",
                "--pipeline_parallel=2 does not divide 3 ranks"},
        Refused{"--dry_run_world_size=2 --pipeline_parallel=2 --num_layers=3",
                "--num_layers=3 does not split evenly over 2 pipeline stages "
                "(--pipeline_parallel=2 x --virtual_pipeline=1); change the layer count or set "
                "--first_stage_layers / --last_stage_layers"},
        Refused{"--dry_run_world_size=4 --pipeline_parallel=4",
                "--num_layers=2 is fewer than the 4 pipeline stages (--pipeline_parallel=4 x "
                "--virtual_pipeline=1); every stage needs at least one layer"},
        Refused{"--dry_run_world_size=2 --global_batch_size=8 --micro_batch_size=8",
                "--global_batch_size=8 is not a multiple of --micro_batch_size=8 x data-parallel "
                "size 2"},
        Refused{"--dry_run_world_size=2 --device=cuda:1",
                "--device=cuda:1 needs one process: under mpirun each rank takes the GPU of its "
                "local rank: use --device=cuda"},
        Refused{"--virtual_pipeline=2",
                "--virtual_pipeline=2 needs --pipeline_parallel > 1: chunks interleave across "
                "pipeline ranks"},
        Refused{"--hidden_size=66 --num_attention_heads=4",
                "--hidden_size=66 is not a multiple of --num_attention_heads=4 (or set the head "
                "dimension with --kv_channels)"},
        // The target's GPU (--device=auto) takes head dims 64 and 128, on a machine without one.
        Refused{"--hidden_size=96",
                "--hidden_size / --num_attention_heads = 48: the CUDA attention kernels take head "
                "dims 64 and 128"},
        Refused{"--device=cpu --memory_budget_gib=1 --offload_fraction=0.5",
                "--offload_fraction=0.5 needs no --memory_budget_gib: the memory plan decides per "
                "layer and group"},
        Refused{"--device=cpu configs/tiny.flags",
                "unexpected argument 'configs/tiny.flags' (flags are --name=value; a flagfile is "
                "--flagfile=FILE)"}));

// The flags name the target machine's files: not looked at (none of these exists here).
TEST(DryRunCliTest, FilesTheFlagsNameAreNotLookedAt) {
  const SplitCommandResult r = DryRun(
      "--device=cpu --save=/nonexistent/ckpt --load=/nonexistent/ckpt --data_format=megatron "
      "--data_path=/nonexistent/tokens --metrics_file=/nonexistent/m.jsonl "
      "--trace_file=/nonexistent/t.json");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Lines(r.out, "verdict: fits in 80 GiB").size(), 1u) << r.out;
}

// --dry_run_json: the same figures, exactly, as one JSON object.
TEST(DryRunCliTest, JsonIsTheSameReport) {
  const std::string args =
      "--device=cpu --num_layers=8 --dry_run_world_size=8 --pipeline_parallel=4 "
      "--global_batch_size=64 --use_distributed_optimizer --dry_run_device_memory_gib=0.05";
  const SplitCommandResult text = DryRun(args);
  const SplitCommandResult json = DryRun(args + " --dry_run_json");
  ASSERT_EQ(json.exit_code, 0) << json.out << json.err;
  const nlohmann::json report = nlohmann::json::parse(json.out);
  EXPECT_EQ(report["world_size"], 8);
  EXPECT_EQ(report["data_parallel"], 2);
  ASSERT_EQ(report["ranks"].size(), 4u);
  double parameters = 0;
  for (const nlohmann::json& rank : report["ranks"]) {
    parameters += rank["parameters"].get<double>();
    EXPECT_EQ(rank["weight_bytes"].get<double>() + rank["gradient_bytes"].get<double>() +
                  rank["optimizer_bytes"].get<double>() + rank["activation_bytes"].get<double>() +
                  rank["workspace_bytes"].get<double>(),
              rank["total_bytes"].get<double>())
        << rank;
  }
  EXPECT_EQ(parameters, report["total_parameters"].get<double>());
  EXPECT_EQ(report["ranks"][0]["passes_in_flight"], 4);
  EXPECT_EQ(report["fits"], Line(text.out, "verdict: fits").find("(no line") == std::string::npos);
  EXPECT_EQ("verdict: " + report["verdict"].get<std::string>(), Line(text.out, "verdict: "));
}

}  // namespace
}  // namespace moe
