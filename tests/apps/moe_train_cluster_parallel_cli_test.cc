// moe_train under mpirun on a cluster (issue 53): ranks started with different flags (model
// shape, optimizer, schedule, data) are one line from rank 0 and exit code 2 on every rank within
// seconds, never a run, a hang or an abort; a stop signal that reaches one rank, or all of them
// through mpirun, stops every rank at the same step, saved; a rank that stops answering ends the
// job through the communication watchdog in one line naming the operation, the rank that did not
// arrive and the step, exit code 1. A plain (label cpu) test, as it starts mpirun itself.
#include <gtest/gtest.h>

#include "tests/testing/command.h"

#if MOE_WITH_MPI

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/background_command.h"
#include "tests/testing/moe_train_cluster.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using testing::BackgroundCommand;
using testing::CommandResult;
using testing::ScopedTempDir;

int Count(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// Ranks started with different flags: `ranks` ranks, the last `others` of them with `other`
// added to their command line (an MPMD job: mpirun -np A ... : -np B ...), from `dir` where a
// token file of each size is.
struct Mismatch {
  std::string kind;
  int ranks;
  int others;
  std::string common;  // beside SmallEndlessRun and --train_steps=2
  std::string other;
  std::string line;  // the one line rank 0 prints
};

void PrintTo(const Mismatch& m, std::ostream* os) { *os << m.kind << " -np " << m.ranks; }

class MismatchTest : public ::testing::TestWithParam<Mismatch> {};

TEST_P(MismatchTest, IsOneLineFromRankZeroAndExitTwoOnEveryRank) {
  const Mismatch& m = GetParam();
  const ScopedTempDir dir;
  // The same file name in two directories, of two sizes; the ranks that differ start in the
  // second (mpirun -wdir).
  fs::create_directories(dir.Path("a"));
  fs::create_directories(dir.Path("b"));
  std::ofstream(dir.Path("a/tokens.bin")) << std::string(8192, '\1');
  std::ofstream(dir.Path("b/tokens.bin")) << std::string(4096, '\1');
  const std::string run = testing::SmallEndlessRun() + " --train_steps=2 " + m.common;
  const std::string command = "timeout 120 " + testing::Mpirun(m.ranks - m.others) + "-wdir " +
                              dir.Path("a") + " " + run + " : -np " + std::to_string(m.others) +
                              " -wdir " + dir.Path(m.kind == "data" ? "b" : "a") + " " + run + " " +
                              m.other;
  const CommandResult r = testing::RunCommand(command);
  EXPECT_EQ(r.exit_code, 2) << r.output;  // 124: the job hung
  EXPECT_LT(r.seconds, 60) << r.output;
  EXPECT_EQ(Count(r.output, "moe_train: " + m.line + " (rank "), 1) << r.output;
  EXPECT_EQ(Count(r.output, "moe_train:"), 1) << "one line, from rank 0: " << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "work started: " << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, MismatchTest,
    ::testing::Values(
        Mismatch{"model shape", 2, 1, "", "--num_layers=4",
                 "rank 1 runs another configuration than rank 0: --num_layers is 4 on rank 1, 2 "
                 "on rank 0"},
        Mismatch{"optimizer", 2, 1, "", "--lr=0.001",
                 "rank 1 runs another configuration than rank 0: --lr is 0.001 on rank 1, 0.003 "
                 "on rank 0"},
        Mismatch{"schedule", 4, 2, "", "--train_steps=3",
                 "rank 2 runs another configuration than rank 0: --train_steps is 3 on rank 2, 2 "
                 "on rank 0"},
        Mismatch{"data", 4, 1, "--data_format=flat_u16 --data_path=tokens.bin", "",
                 "rank 3 runs another configuration than rank 0: the size of tokens.bin "
                 "(--data_path) is 4096 bytes on rank 3, 8192 bytes on rank 0"}));

// A stop signal sent to one rank (SIGTERM, as a scheduler sends it to the processes of a job
// step) or to mpirun (SIGUSR1, which mpirun forwards to every rank): every rank stops after the
// same step, which is saved; the same command line with --load continues.
struct StopCase {
  int ranks;
  int signal;
  bool to_mpirun;  // else to rank 1 alone
  std::string why;
};

void PrintTo(const StopCase& c, std::ostream* os) {
  *os << "-np " << c.ranks << " signal " << c.signal << (c.to_mpirun ? " to mpirun" : "");
}

class StopTest : public ::testing::TestWithParam<StopCase> {};

TEST_P(StopTest, EveryRankStopsAtTheSameStepWhichIsSaved) {
  const StopCase& c = GetParam();
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const std::string run = testing::Mpirun(c.ranks) + testing::SmallEndlessRun() +
                          " --pipeline_parallel=2 --save=" + root;
  BackgroundCommand job(run, dir.Path("out"));
  ASSERT_TRUE(job.WaitForOutput("step      2 |", 120)) << job.Output();
  const int64_t logged = testing::LastLoggedStep(job.Output());
  if (c.to_mpirun) {
    job.Signal(c.signal);
  } else {
    const auto ranks = job.MpiRanks();
    ASSERT_EQ(ranks.size(), static_cast<size_t>(c.ranks)) << job.Output();
    kill(ranks.at(1), c.signal);
  }
  EXPECT_EQ(job.Wait(120), 75) << job.Output();
  const std::string output = job.Output();
  const int64_t step = testing::ResumeStep(root);
  EXPECT_GE(step, logged) << output;
  EXPECT_NE(output.find("stopped at step " + std::to_string(step) + ": " + c.why + "; checkpoint " +
                        root + "/" + CheckpointStepDirName(step) +
                        ": continue with --load=" + root + " (exit code 75)"),
            std::string::npos)
      << output;
  const CommandResult resumed = testing::RunCommand("timeout 120 " + run + " --load=" + root +
                                                    " --train_steps=" + std::to_string(step + 1));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(testing::ResumeStep(root), step + 1);
}

INSTANTIATE_TEST_SUITE_P(
    Signals, StopTest,
    ::testing::Values(StopCase{2, SIGTERM, false, "SIGTERM (received by 1 of 2 ranks)"},
                      StopCase{4, SIGTERM, false, "SIGTERM (received by 1 of 4 ranks)"},
                      StopCase{2, SIGUSR1, true, "SIGUSR1 (received by 2 of 2 ranks)"}));

// Rank 1 stopped (SIGSTOP: as a hung node looks to the others): rank 0's next collective times
// out, and the job ends in one line from rank 0, exit code 1, without an abort's stack trace.
TEST(WatchdogTest, ARankThatStopsAnsweringEndsTheJobInOneLine) {
  const ScopedTempDir dir;
  BackgroundCommand job(
      testing::Mpirun(2) + testing::SmallEndlessRun() + " --distributed_timeout_minutes=0.05",
      dir.Path("out"));
  ASSERT_TRUE(job.WaitForOutput("step      2 |", 120)) << job.Output();
  const auto ranks = job.MpiRanks();
  ASSERT_EQ(ranks.size(), 2u) << job.Output();
  kill(ranks.at(1), SIGSTOP);
  const int64_t logged = testing::LastLoggedStep(job.Output());
  const int code = job.Wait(120);
  kill(ranks.at(1), SIGKILL);  // if mpirun left it stopped
  const std::string output = job.Output();
  EXPECT_EQ(code, 1) << output;
  EXPECT_EQ(Count(output, "moe_train: step "), 1) << output;
  const size_t line = output.find("moe_train: step ");
  ASSERT_NE(line, std::string::npos) << output;
  const std::string text = output.substr(line, output.find('\n', line) - line);
  const int64_t step = std::stoll(text.substr(16));
  // The last step line read may lag the stopped rank by one more step on a loaded machine
  // (mpirun forwards rank 0's output; rank 1 may have sent its part of the next step's
  // collectives before it stopped).
  EXPECT_GE(step, logged) << text;
  EXPECT_LE(step, logged + 2) << text;
  EXPECT_NE(text.find(": communicator MPI rank 0/2 timed out: "), std::string::npos) << text;
  EXPECT_NE(text.find(" has not finished after "), std::string::npos) << text;
  EXPECT_NE(text.find("(timeout 3000 ms); rank 1 did not arrive (rank 0, host "), std::string::npos)
      << text;
  EXPECT_EQ(output.find("stack trace"), std::string::npos) << output;
  EXPECT_EQ(output.find("Check failed"), std::string::npos) << output;
}

}  // namespace
}  // namespace moe
#endif  // MOE_WITH_MPI
