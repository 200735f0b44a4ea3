// Stop signals: the first SIGTERM, SIGINT or SIGUSR1 is recorded and the process goes on; a
// second one, of any of the three, ends it at once by that signal.
#include "engine/runtime/stop_signal.h"

#include <gtest/gtest.h>

#include <csignal>

namespace moe {
namespace {

// One test: the handlers and the recorded signal are process-wide.
TEST(StopSignalTest, TheFirstSignalIsRecordedTheSecondEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  InstallStopSignalHandlers();
  EXPECT_EQ(StopSignalReceived(), 0);
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_EQ(StopSignalReceived(), SIGUSR1);  // and this process lives on
  EXPECT_STREQ(StopSignalName(StopSignalReceived()), "SIGUSR1");
  EXPECT_EXIT(raise(SIGTERM), ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_EXIT(raise(SIGINT), ::testing::KilledBySignal(SIGINT), "");
  EXPECT_EQ(StopSignalReceived(), SIGUSR1);
}

}  // namespace
}  // namespace moe
