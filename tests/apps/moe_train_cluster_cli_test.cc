// moe_train as one process on a cluster's scheduler (issue 53): a stop signal finishes the step,
// saves it and exits 75, a second one ends the run at once without harm to the checkpoints;
// --exit_interval and --exit_duration_in_mins stop the same way; a second run on one --save
// directory is refused naming the first (and a killed run leaves no stale lock); the next run
// removes what interrupted saves left and resumes from the newest complete step directory even
// without `latest`; one command line starts a run and resumes it; a reference case dumps whatever
// micro-batch it is given. Every test works in a temporary directory of its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>

#include "engine/core/check.h"
#include "tests/testing/background_command.h"
#include "tests/testing/command.h"
#include "tests/testing/moe_train_cluster.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using testing::BackgroundCommand;
using testing::CommandResult;
using testing::ScopedTempDir;

bool HasTemporaries(const std::string& root) {
  return !ListCheckpointRoot(root).temporaries.empty();
}

// The stop line of a run that stopped at `step` on `why`, having saved it to `root`.
std::string StopLine(int64_t step, const std::string& why, const std::string& root) {
  return "stopped at step " + std::to_string(step) + ": " + why + "; checkpoint " + root + "/" +
         CheckpointStepDirName(step) + ": continue with --load=" + root + " (exit code 75)\n";
}

TEST(MoeTrainClusterTest, ASigtermFinishesTheStepSavesItAndExits75) {
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  BackgroundCommand run(testing::SmallEndlessRun() + " --save=" + root, dir.Path("out"));
  ASSERT_TRUE(run.WaitForOutput("step      3 |", 60)) << run.Output();
  const int64_t logged = testing::LastLoggedStep(run.Output());
  run.Signal(SIGTERM);
  EXPECT_EQ(run.Wait(60), 75) << run.Output();
  const std::string output = run.Output();
  const int64_t step = testing::ResumeStep(root);
  EXPECT_GE(step, logged) << "the checkpoint is older than the step the signal came in";
  EXPECT_LE(step, logged + 2) << output;
  EXPECT_NE(output.find(StopLine(step, "SIGTERM", root)), std::string::npos) << output;
  EXPECT_EQ(testing::LastLoggedStep(output), step) << "a step began after the stop";
  EXPECT_FALSE(HasTemporaries(root));

  const CommandResult resumed = testing::RunCommand(testing::SmallEndlessRun() +
                                                    " --train_steps=" + std::to_string(step + 1) +
                                                    " --save=" + root + " --load=" + root);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("schedule: steps " + std::to_string(step + 1) + " from " +
                                std::to_string(step)),
            std::string::npos)
      << resumed.output;
}

// A save interrupted by the second signal: the run dies of it at once; the checkpoint before
// stays whole and is where the next run resumes, which removes the interrupted save's leftovers.
TEST(MoeTrainClusterTest, ASecondSignalDuringTheSaveEndsTheRunAndSparesTheCheckpoints) {
  // Large enough that a save takes a while: the second signal comes while its temporary exists.
  const std::string large =
      " --hidden_size=256 --num_experts=8 --moe_ffn_hidden_size=512 --save_interval=2";
  for (int attempt = 0; attempt < 10; ++attempt) {
    const ScopedTempDir dir;
    const std::string root = dir.Path("ckpt");
    BackgroundCommand run(testing::SmallEndlessRun() + large + " --save=" + root, dir.Path("out"));
    ASSERT_TRUE(run.WaitForOutput("saved checkpoint " + root + "/step_00000002", 120))
        << run.Output();
    run.Signal(SIGTERM);
    bool saving = false;
    for (int poll = 0; poll < 60000 && !saving; ++poll) {
      saving = HasTemporaries(root);
      if (!saving) std::this_thread::sleep_for(std::chrono::microseconds(500));
      if (run.Output().find("stopped at step") != std::string::npos) break;
    }
    if (!saving) {  // the save was over before the poll saw it: try again
      run.Wait(60);
      continue;
    }
    run.Signal(SIGTERM);
    const int code = run.Wait(60);
    if (code == 75) continue;  // the save was over before the second signal came: try again
    EXPECT_EQ(code, 128 + SIGTERM) << run.Output();
    const int64_t step = testing::ResumeStep(root);
    EXPECT_GE(step, 2);
    const CommandResult resumed = testing::RunCommand(testing::SmallEndlessRun() + large +
                                                      " --train_steps=" + std::to_string(step + 1) +
                                                      " --save=" + root + " --load=" + root);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("checkpoints: removed what interrupted saves left in " + root),
              std::string::npos)
        << resumed.output;
    EXPECT_FALSE(HasTemporaries(root));
    return;
  }
  FAIL() << "no save was caught in progress in 10 attempts";
}

TEST(MoeTrainClusterTest, ExitIntervalStopsAtEachMultipleAndSaves) {
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const std::string command =
      testing::SmallEndlessRun() + " --exit_interval=3 --save=" + root + " --load=" + root;
  CommandResult r = testing::RunCommand(command);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find(StopLine(3, "--exit_interval=3", root)), std::string::npos) << r.output;
  // The same command resumes and stops at the next multiple, not at the step it resumed from.
  r = testing::RunCommand(command);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find(StopLine(6, "--exit_interval=3", root)), std::string::npos) << r.output;
  EXPECT_EQ(testing::ResumeStep(root), 6);
}

TEST(MoeTrainClusterTest, ExitDurationStopsAndSavesBeforeTheLimit) {
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const CommandResult r = testing::RunCommand(testing::SmallEndlessRun() +
                                              " --exit_duration_in_mins=0.1 --save=" + root);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
  const int64_t step = testing::ResumeStep(root);
  EXPECT_GT(step, 0);
  EXPECT_NE(r.output.find("stopped at step " + std::to_string(step) +
                          ": --exit_duration_in_mins=0.1: the next step would end after it ("),
            std::string::npos)
      << r.output;
}

TEST(MoeTrainClusterTest, ASecondRunOnTheSameSaveIsRefusedNamingTheFirst) {
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  BackgroundCommand first(testing::SmallEndlessRun() + " --save=" + root, dir.Path("out"));
  ASSERT_TRUE(first.WaitForOutput("step      1 |", 60)) << first.Output();
  const testing::SplitCommandResult second =
      testing::RunCommandSplit(testing::SmallEndlessRun() + " --save=" + root);
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_EQ(second.out, "");
  EXPECT_EQ(second.err, "moe_train: --save " + root + " is in use by process " +
                            std::to_string(first.pid()) + " on host " + HostName() +
                            " (its lock file " + root +
                            "/.lock): wait for it to end, or save to another directory\n");
  // Killed outright, the first run leaves no lock behind: the same command line takes over.
  first.Signal(SIGKILL);
  EXPECT_EQ(first.Wait(60), 128 + SIGKILL);
  const CommandResult third =
      testing::RunCommand(testing::SmallEndlessRun() + " --train_steps=1 --save=" + root);
  EXPECT_EQ(third.exit_code, 0) << third.output;
}

// Killed during a save: a temporary step directory and `latest.tmp`; killed between publishing the
// first save and writing `latest`: a complete step directory and no `latest`.
TEST(MoeTrainClusterTest, TheNextRunCleansUpAndResumesWithoutLatest) {
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  CommandResult r = testing::RunCommand(testing::SmallEndlessRun() +
                                        " --train_steps=2 --save_interval=1 --save=" + root);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::remove(root + "/latest");
  fs::create_directories(root + "/.step_00000003.tmp-999999");
  testing::RunCommand("head -c 1000 /dev/zero > " + root +
                      "/.step_00000003.tmp-999999/model.safetensors");
  testing::RunCommand("echo step_00000003 > " + root + "/latest.tmp");

  // --save alone is refused, suggesting the --load that resumes.
  r = testing::RunCommand(testing::SmallEndlessRun() + " --train_steps=3 --save=" + root);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--save " + root +
                          " already holds checkpoints (up to step_00000002); resume with --load=" +
                          root + ", or save to a new directory"),
            std::string::npos)
      << r.output;
  r = testing::RunCommand(testing::SmallEndlessRun() + " --train_steps=3 --save=" + root +
                          " --load=" + root);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume: " + root +
                          ": resuming from step_00000002, its newest complete step directory: it "
                          "has no 'latest'\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("checkpoints: removed what interrupted saves left in " + root +
                          ": .step_00000003.tmp-999999, latest.tmp\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("schedule: steps 3 from 2"), std::string::npos) << r.output;
  EXPECT_FALSE(HasTemporaries(root));
  EXPECT_EQ(testing::ResumeStep(root), 3);

  // The newest step directory damaged: the one before it is taken, saying why.
  const std::string model = root + "/step_00000003/model.safetensors";
  fs::resize_file(model, fs::file_size(model) / 2);
  r = testing::RunCommand(testing::SmallEndlessRun() + " --train_steps=3 --save=" + root +
                          " --load=" + root);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume: " + root +
                          ": resuming from step_00000002, its newest complete step directory: "
                          "'latest' names step_00000003, which is incomplete ('" +
                          model + "': "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(testing::ResumeStep(root), 3) << "step 3 saved again, whole";
}

// One command line for a job's first start and every restart: --load naming --save, empty.
TEST(MoeTrainClusterTest, OneCommandLineStartsAndResumes) {
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  const std::string command =
      testing::SmallEndlessRun() + " --train_steps=2 --save=" + root + " --load=" + root;
  CommandResult r = testing::RunCommand(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume: --load " + root +
                          " holds no checkpoint yet (it is --save): training from step 0\n"),
            std::string::npos)
      << r.output;
  r = testing::RunCommand(command);
  EXPECT_EQ(r.exit_code, 2) << r.output;  // nothing left to train
  EXPECT_NE(r.output.find("--train_steps=2 is not beyond step 2 of --load"), std::string::npos)
      << r.output;
  // Without --save it is not the run's own directory: a missing checkpoint is an error.
  r = testing::RunCommand(testing::SmallEndlessRun() + " --load=" + dir.Path("none"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// Issue 53, item 5: --global_batch_size, refused as unused, was still checked against
// --micro_batch_size with its default (16 is not a multiple of 144).
TEST(MoeTrainClusterTest, AReferenceCaseTakesAnyMicroBatch) {
  const ScopedTempDir dir;
  const CommandResult r = testing::RunCommand(
      std::string(MOE_TRAIN_BINARY) +
      " --device=cpu --num_layers=2 --hidden_size=32 --seq_length=16 --micro_batch_size=144 "
      "--dump_reference_case=" +
      dir.Path("ref"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.Path("ref/reference.safetensors"))) << r.output;
}

}  // namespace
}  // namespace moe
