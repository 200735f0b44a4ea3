// moe_train's --trace_file and --trace_steps as a user meets them: a good run writes a Chrome
// trace of exactly the chosen steps and metrics whose step breakdown adds up to the step time;
// a bad value is one line naming the flag and exit code 2 before any work; under mpirun every
// rank writes its own file (pid = rank) with its pipeline communication.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"
#include "tests/testing/moe_train_run.h"
#include "tests/testing/source_tree.h"

namespace moe {
namespace {

using Result = testing::CommandResult;
using nlohmann::json;
using testing::BadInput;
using testing::RunMoeTrain;

// configs/tiny.flags of this source tree.
std::string TinyFlags() { return testing::ConfigPath("tiny.flags"); }

json ReadJson(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << path;
  return json::parse(file);  // throws (failing the test) unless the file is JSON
}

// The names of the trace's "step N" spans.
std::multiset<std::string> StepSpans(const json& trace) {
  std::multiset<std::string> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X" && e.at("name").get<std::string>().starts_with("step ")) {
      out.insert(e.at("name").get<std::string>());
    }
  }
  return out;
}

const char* const kPhaseFields[] = {"forward_ms",
                                    "backward_ms",
                                    "optimizer_ms",
                                    "pipeline_wait_ms",
                                    "data_parallel_wait_ms",
                                    "offload_wait_ms",
                                    "expert_parallel_wait_ms",
                                    "other_ms"};

TEST(TraceCliTest, TracesTheChosenStepsAndReportsTheBreakdown) {
  ASSERT_TRUE(std::filesystem::exists(TinyFlags())) << TinyFlags();
  const testing::ScopedTempDir dir;
  const std::string trace_path = dir.Path("t.json");
  const std::string metrics = dir.Path("metrics.jsonl");
  const Result r = RunMoeTrain("--device=cpu --flagfile=" + TinyFlags() +
                               " --train_steps=4 --warmup_steps=1 --log_interval=1 "
                               "--eval_interval=0 --eval_steps=1 --trace_file=" +
                               trace_path + " --trace_steps=2:3 --metrics_file=" + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote trace of steps 2-3 to " + trace_path), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(fwd "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" reload wait "), std::string::npos) << r.output;

  const json trace = ReadJson(trace_path);
  EXPECT_EQ(StepSpans(trace), (std::multiset<std::string>{"step 2", "step 3"}));
  int spans = 0;
  for (const json& e : trace.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 0) << e.dump();
    if (e.at("ph") == "X") {
      ++spans;
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
      const int step = e.at("args").at("step");
      EXPECT_TRUE(step == 2 || step == 3) << e.dump();
    }
  }
  EXPECT_GT(spans, 20);

  std::ifstream lines(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(lines, line)) {
    const json record = json::parse(line);
    if (!record.contains("loss")) continue;  // evaluation
    ++steps;
    double sum = 0;
    for (const char* field : kPhaseFields) {
      ASSERT_TRUE(record.contains(field)) << field << " missing: " << line;
      EXPECT_GE(record.at(field).get<double>(), 0.0) << field << ": " << line;
      sum += record.at(field).get<double>();
    }
    const double ms_per_step = record.at("ms_per_step");
    EXPECT_NEAR(sum, ms_per_step, 0.05 * ms_per_step) << line;
    EXPECT_GT(record.at("forward_ms").get<double>(), 0.0) << line;
    EXPECT_GT(record.at("backward_ms").get<double>(), 0.0) << line;
  }
  EXPECT_EQ(steps, 4);
}

class TraceBadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(TraceBadInputTest, ExitsWithOneLineNamingTheFlag) {
  const Result r = RunMoeTrain("--device=cpu --train_steps=4 --warmup_steps=1 " + GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("| loss"), std::string::npos) << "work started: " << r.output;
  EXPECT_EQ(r.output.find("parameters:"), std::string::npos) << "work started: " << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// A directory where the trace file should be: the test temporary directory, which exists.
std::string ADirectory() {
  std::string dir = ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string ATraceFile() { return " --trace_file=" + ::testing::TempDir() + "/trace_cli_bad.json"; }

INSTANTIATE_TEST_SUITE_P(
    Flags, TraceBadInputTest,
    ::testing::Values(BadInput{"--trace_steps=3" + ATraceFile(), "--trace_steps=3 must be A:B"},
                      BadInput{"--trace_steps=0:2" + ATraceFile(),
                               "--trace_steps=0:2 must be A:B with 1 <= A <= B"},
                      BadInput{"--trace_steps=3:2" + ATraceFile(),
                               "--trace_steps=3:2 must be A:B with 1 <= A <= B"},
                      BadInput{"--trace_steps=2:x" + ATraceFile(),
                               "--trace_steps=2:x must be A:B with 1 <= A <= B"},
                      BadInput{"--trace_steps=2:9" + ATraceFile(),
                               "--trace_steps=2:9 ends after --train_steps=4"},
                      BadInput{"--trace_steps=2:2", "--trace_steps=2:2 needs --trace_file"},
                      BadInput{"--trace_file=/nonexistent/dir/t.json",
                               "--trace_file /nonexistent/dir/t.json"},
                      BadInput{"--trace_file=" + ADirectory(),
                               "--trace_file " + ADirectory() + ": not a regular file"}));

#if MOE_WITH_MPI

// Two ranks, two pipeline stages: t.rank0.json and t.rank1.json, each its own process, with the
// stage's pipeline sends and receives on the pipeline comm track.
TEST(TraceCliTest, EveryRankWritesItsOwnTraceUnderMpirun) {
  const testing::ScopedTempDir dir;
  const std::string stem = dir.Path("pp");
  const Result r = testing::RunCommand(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe " +
      std::string(MOE_TRAIN_BINARY) +
      " --device=cpu --train_steps=2 --warmup_steps=1 --log_interval=1 --num_layers=4 "
      "--hidden_size=32 --seq_length=16 --eval_steps=1 --pipeline_parallel=2 --trace_steps=2:2 "
      "--trace_file=" +
      stem + ".json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(stem + ".json")) << "a file for no rank";
  for (int rank : {0, 1}) {
    const json trace = ReadJson(stem + ".rank" + std::to_string(rank) + ".json");
    EXPECT_EQ(StepSpans(trace), std::multiset<std::string>{"step 2"}) << "rank " << rank;
    // Stage 0 sends activations to rank 1 and receives gradients from it; stage 1 the reverse.
    const std::string peer = "r" + std::to_string(1 - rank);
    const std::string sends = rank == 0 ? "SendAct(" : "SendGrad(";
    const std::string receives = rank == 0 ? "RecvGrad(" : "RecvAct(";
    std::string comm;  // every pipeline comm span's name
    for (const json& e : trace.at("traceEvents")) {
      EXPECT_EQ(e.at("pid"), rank) << e.dump();
      if (e.at("ph") == "X" && e.at("tid") == 4) {  // the pipeline comm track
        const std::string name = e.at("name");
        EXPECT_NE(name.find(peer), std::string::npos) << "rank " << rank << ": " << name;
        EXPECT_EQ(e.at("cat"), "pipeline comm");
        comm += name + "; ";
      }
    }
    EXPECT_NE(comm.find(sends + "m0,c0)->" + peer), std::string::npos) << rank << ": " << comm;
    EXPECT_NE(comm.find(receives + "m0,c0)<-" + peer), std::string::npos) << rank << ": " << comm;
  }
}

#endif  // MOE_WITH_MPI

}  // namespace
}  // namespace moe
