// Issue 53: a run sent SIGTERM at any moment resumes from a checkpoint at most one step older
// than the signal. Trials send it at random moments (while the run starts, trains, evaluates or
// saves; sometimes a second one soon after, which ends the run at once, possibly mid-save) to one
// process and to mpirun jobs of 2 and 4 ranks, then run the same command line again with --load.
// Every trial: the stopped run exited 75 (saved the step it was in, at least the last one logged)
// or died of the second signal; every step directory left is complete; the next run loads the
// newest one (or starts from step 0 when there is none), removes every temporary and trains on.
// A plain (label cpu) test: it starts moe_train and mpirun itself.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/background_command.h"
#include "tests/testing/command.h"
#include "tests/testing/moe_train_cluster.h"

namespace moe {
namespace {

using testing::BackgroundCommand;
using testing::CommandResult;
using testing::ScopedTempDir;

// One trial: `launcher` + the run, saving every other step; the signal `delay_ms` after the
// start, to mpirun's rank `target` (-1: the process itself); a second one `second_ms` later (-1:
// none).
void Trial(const std::string& launcher, int ranks, int delay_ms, int target, int second_ms) {
  SCOPED_TRACE("ranks " + std::to_string(ranks) + ", signal after " + std::to_string(delay_ms) +
               " ms" +
               (second_ms >= 0 ? ", again " + std::to_string(second_ms) + " ms later" : ""));
  const ScopedTempDir dir;
  const std::string root = dir.Path("ckpt");
  // Under mpirun two pipeline stages (and 1 or 2 replicas): transfers as well as collectives.
  const std::string command = launcher + testing::SmallEndlessRun() +
                              (ranks > 1 ? " --pipeline_parallel=2" : "") +
                              " --save_interval=2 --save=" + root + " --load=" + root;
  BackgroundCommand run(command, dir.Path("out"));
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const int64_t logged = testing::LastLoggedStep(run.Output());
  bool signalled = false;  // the rank has had a signal (a second finds it gone if it has ended)
  const auto send = [&] {
    if (target < 0) return run.Signal(SIGTERM);
    for (int wait = 0; wait < 3000; ++wait) {  // until mpirun has started the rank
      const auto pids = run.MpiRanks();
      if (pids.count(target)) {
        signalled = true;
        return static_cast<void>(kill(pids.at(target), SIGTERM));
      }
      if (signalled) return;  // it stopped after the first signal, before this one
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "rank " << target << " never started: " << run.Output();
  };
  send();
  if (second_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(second_ms));
    send();
  }
  const int code = run.Wait(120);
  const std::string output = run.Output();
  ASSERT_NE(code, -1) << "the run did not end: " << output;
  const CheckpointRootEntries entries = ListCheckpointRoot(root);
  for (const std::string& name : entries.step_dirs) {
    EXPECT_TRUE(ReadStepDirectory(root + "/" + name).ok()) << name << " is incomplete";
  }
  const int64_t step = testing::ResumeStep(root);
  if (code == 75) {
    EXPECT_GE(step, logged) << output;
    EXPECT_NE(output.find("stopped at step " + std::to_string(step) + ": SIGTERM"),
              std::string::npos)
        << output;
  } else if (code != 128 + SIGTERM && ranks == 1) {
    ADD_FAILURE() << "exit code " << code << ": " << output;
  }
  // Under mpirun a rank that dies of the second signal makes mpirun end the job with its own
  // code; the checkpoints are what matters.
  const CommandResult resumed =
      testing::RunCommand("timeout 120 " + command + " --train_steps=" + std::to_string(step + 1));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("schedule: steps " + std::to_string(step + 1) + " from " +
                                std::to_string(step)),
            std::string::npos)
      << resumed.output;
  EXPECT_TRUE(ListCheckpointRoot(root).temporaries.empty());
  EXPECT_EQ(testing::ResumeStep(root), step + 1);
}

// The trials, `parallel` at a time (a run spends much of its time starting: MPI's start waits
// more than it computes).
struct TrialSpec {
  int ranks;
  int delay_ms;
  int target;
  int second_ms;
};

void RunTrials(const std::vector<TrialSpec>& specs, int parallel) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < parallel; ++t) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < specs.size(); i = next++) {
        const TrialSpec& spec = specs[i];
        Trial(spec.ranks == 1 ? "" : testing::Mpirun(spec.ranks), spec.ranks, spec.delay_ms,
              spec.target, spec.second_ms);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// A second signal in a third of the trials, 0 to 60 ms after the first.
int SecondSignal(std::mt19937& rng) {
  const bool twice = std::uniform_int_distribution<int>(0, 2)(rng) == 0;
  return twice ? std::uniform_int_distribution<int>(0, 60)(rng) : -1;
}

TEST(SignalTrialsTest, OneProcess) {
  std::mt19937 rng(53);
  std::vector<TrialSpec> specs;
  for (int trial = 0; trial < 20; ++trial) {
    const int delay = std::uniform_int_distribution<int>(0, 2500)(rng);
    specs.push_back({1, delay, -1, SecondSignal(rng)});
  }
  RunTrials(specs, 4);
}

TEST(SignalTrialsTest, UnderMpirun) {
  std::mt19937 rng(54);
  std::vector<TrialSpec> specs;
  for (const int ranks : {2, 2, 4, 4}) {
    const int delay = std::uniform_int_distribution<int>(500, 4000)(rng);
    const int target = std::uniform_int_distribution<int>(0, ranks - 1)(rng);
    specs.push_back({ranks, delay, target, SecondSignal(rng)});
  }
  RunTrials(specs, 2);
}

}  // namespace
}  // namespace moe
