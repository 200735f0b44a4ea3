// CommWatchdog: finished operations pass; an operation that outlives the timeout, or an
// asynchronous backend error, aborts the backend and ends the process with a message.
#include "engine/dist/comm_watchdog.h"

#include <gtest/gtest.h>

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

TEST(CommWatchdogTest, OperationsThatFinishInTimePass) {
  std::atomic<int> polls{0};
  CommWatchdog::Hooks hooks;
  hooks.async_error = [&polls] {
    ++polls;
    return std::string();
  };
  CommWatchdog watchdog("test", milliseconds(100), hooks);
  auto done = std::make_shared<std::atomic<bool>>(false);
  watchdog.Track("quick op", [done] { return done->load(); });
  watchdog.Track("finished op", [] { return true; });
  std::this_thread::sleep_for(milliseconds(50));
  done->store(true);
  std::this_thread::sleep_for(milliseconds(400));  // four timeouts
  EXPECT_GT(polls.load(), 5);
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
