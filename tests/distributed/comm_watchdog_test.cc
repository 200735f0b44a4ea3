// CommWatchdog: finished operations pass; an operation that outlives the timeout, or an
// asynchronous backend error, aborts the backend and ends the process with a message (through
// the app's handler when one is installed, with what the census found); time the process spent
// stopped does not count.
#include "engine/distributed/comm_watchdog.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

namespace moe {
namespace {

using std::chrono::milliseconds;

class CommWatchdogDeathTest : public ::testing::Test {
 protected:
  CommWatchdogDeathTest() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Operations that finish within the timeout are checked until they are done and then dropped;
// nothing is aborted and the process lives on past several timeouts.
TEST(CommWatchdogTest, OperationsThatFinishInTimePass) {
  std::atomic<int> setups{0}, polls{0}, aborts{0}, quick_checks{0}, finished_checks{0};
  CommWatchdog::Hooks hooks;
  hooks.thread_setup = [&setups] { ++setups; };
  hooks.async_error = [&polls] {
    ++polls;
    return std::string();
  };
  hooks.abort = [&aborts] { ++aborts; };
  CommWatchdog watchdog("test", milliseconds(100), hooks);
  auto done = std::make_shared<std::atomic<bool>>(false);
  watchdog.Track("quick op", [done, &quick_checks] {
    ++quick_checks;
    return done->load();
  });
  watchdog.Track("finished op", [&finished_checks] {
    ++finished_checks;
    return true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  done->store(true);
  std::this_thread::sleep_for(milliseconds(200));  // polls every 10 ms: it has seen it done
  const int checks_when_done = quick_checks.load();
  std::this_thread::sleep_for(milliseconds(300));  // three more timeouts
  EXPECT_GT(polls.load(), 5) << "the watchdog stopped polling";
  EXPECT_EQ(setups.load(), 1);
  EXPECT_EQ(aborts.load(), 0);
  EXPECT_GE(checks_when_done, 2) << "the quick op was not watched while it ran";
  EXPECT_EQ(quick_checks.load(), checks_when_done) << "a finished op is still checked";
  EXPECT_EQ(finished_checks.load(), 1) << "checked only once it is the oldest, then dropped";
}

TEST_F(CommWatchdogDeathTest, AnOperationPastTheTimeoutEndsTheProcess) {
  EXPECT_DEATH(
      {
        CommWatchdog::Hooks hooks;
        hooks.abort = [] { std::cerr << "backend aborted" << std::endl; };
        CommWatchdog watchdog("test comm", milliseconds(100), hooks);
        watchdog.Track("finished op", [] { return true; });
        watchdog.Track("Recv of f32[4] (16 bytes) from rank 1", [] { return false; });
        std::this_thread::sleep_for(std::chrono::seconds(10));
      },
      "backend aborted(.|\n)*communicator test comm timed out: Recv of f32\\[4\\] \\(16 bytes\\) "
      "from rank 1 has not finished");
}

// An app's handler gets the message, with what the census found, instead of LOG(FATAL).
TEST_F(CommWatchdogDeathTest, ATimeoutGoesToTheHandlerWithTheCensus) {
  EXPECT_EXIT(
      {
        SetCommFailureHandler([](const std::string& message) {
          std::cerr << "handled: " << message << std::endl;
          _exit(7);
        });
        CommWatchdog::Hooks hooks;
        hooks.census = [](const std::string& operation, milliseconds) {
          CommWatchdog::Census census;
          census.finding = "rank 3 did not arrive at " + operation;
          return census;
        };
        CommWatchdog watchdog("test comm", milliseconds(100), hooks);
        watchdog.Track("Barrier", [] { return false; });
        std::this_thread::sleep_for(std::chrono::seconds(10));
      },
      ::testing::ExitedWithCode(7),
      "handled: communicator test comm timed out: Barrier has not finished after [0-9]+ ms "
      "\\(timeout 100 ms\\); rank 3 did not arrive at Barrier \\(rank");
}

// A process stopped (SIGSTOP) for longer than the timeout does not blame its peers when it
// resumes: the operation's clock restarts, and the process lives on past the rest of the test.
TEST(CommWatchdogTest, TimeFrozenDoesNotCount) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CommWatchdog watchdog("test comm", std::chrono::seconds(2));
    watchdog.Track("Recv of f32[4] (16 bytes) from rank 1", [] { return false; });
    std::this_thread::sleep_for(std::chrono::seconds(4));  // frozen for 3 of them
    _exit(0);
  }
  std::this_thread::sleep_for(milliseconds(200));
  kill(child, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  kill(child, SIGCONT);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the watchdog ended the resumed process (status " << status << ")";
}

TEST_F(CommWatchdogDeathTest, AnAsynchronousErrorEndsTheProcess) {
  EXPECT_DEATH(
      {
        CommWatchdog::Hooks hooks;
        hooks.async_error = [] { return std::string("remote process exited"); };
        CommWatchdog watchdog("test comm", std::chrono::minutes(10), hooks);
        std::this_thread::sleep_for(std::chrono::seconds(10));
      },
      "communicator test comm asynchronous error: remote process exited");
}

}  // namespace
}  // namespace moe
