// When one rank of an MPI job dies, crashes or hangs in a transfer, the whole job ends non-zero
// within seconds instead of hanging. Each test starts `mpirun -np 2` on this very binary,
// running only RankFailureChild.DISABLED_Run (disabled, so a plain run of the binary neither runs
// nor skips it): MOE_RANK_FAILURE_CHILD names the failure. A plain (label cpu) test, as it starts
// mpirun itself.
#include <gtest/gtest.h>

#include "tests/testing/command.h"

#if MOE_WITH_MPI
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/distributed/world.h"
#include "engine/runtime/device_context.h"

namespace moe {
namespace {

constexpr char kModeVariable[] = "MOE_RANK_FAILURE_CHILD";

using JobOutcome = testing::CommandResult;

JobOutcome RunJob(const std::string& mode) {
  char self[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  CHECK_GT(length, 0);
  // `timeout` turns a hang into exit code 124 rather than a stuck test.
  const std::string command =
      std::string(kModeVariable) + "=" + mode +
      " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
      " timeout 120 mpirun -np 2 --oversubscribe -x " +
      kModeVariable + " " + self +
      " --gtest_also_run_disabled_tests --gtest_filter=RankFailureChild.DISABLED_Run";
  return testing::RunCommand(command);
}

void ExpectPromptFailure(const JobOutcome& outcome) {
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_NE(outcome.exit_code, 124) << "the job hung until `timeout` ended it:\n" << outcome.output;
  EXPECT_LT(outcome.seconds, 30) << outcome.output;
}

TEST(RankFailureTest, ARankThatExitsEndsTheJob) {
  const JobOutcome outcome = RunJob("exit");
  ExpectPromptFailure(outcome);
}

TEST(RankFailureTest, ARankThatCrashesEndsTheJob) {
  const JobOutcome outcome = RunJob("crash");
  ExpectPromptFailure(outcome);
  EXPECT_NE(outcome.output.find("rank 1 crashes on purpose"), std::string::npos) << outcome.output;
}

TEST(RankFailureTest, ATransferThatNeverMatchesTimesOut) {
  const JobOutcome outcome = RunJob("hang");
  ExpectPromptFailure(outcome);
  EXPECT_NE(outcome.output.find("timed out: Recv of f32[1024] (4096 bytes) from rank"),
            std::string::npos)
      << outcome.output;
}

// The MPI job of the tests above. Rank 1 exits with code 3, or fails a CHECK; or both ranks wait
// for a message nobody sends, under a one-second communicator timeout. Rank 0 meanwhile waits for
// rank 1 on the comm stream, so only mpirun (or the watchdog) can end it.
TEST(RankFailureChild, DISABLED_Run) {
  const char* mode_value = std::getenv(kModeVariable);
  ASSERT_NE(mode_value, nullptr) << "runs only as the MPI job of RankFailureTest";
  const std::string mode = mode_value;
  StatusOr<std::unique_ptr<World>> world = World::Init();
  ASSERT_TRUE(world.ok()) << world.status().message();
  ASSERT_EQ((*world)->size(), 2);
  const int rank = (*world)->rank();
  std::unique_ptr<Stream> stream = DeviceContext::Get(Device::CPU()).CreateSideStream();
  std::unique_ptr<Communicator> comm = (*world)->NewCommunicator(
      *stream, mode == "hang" ? std::chrono::seconds(1) : std::chrono::seconds(600));
  comm->Barrier();  // both ranks are up
  Tensor buffer = Tensor::Empty({1024}, DType::kF32, Device::CPU());
  if (mode == "hang") {
    comm->Recv(buffer, 1 - rank);
  } else if (rank == 1) {
    if (mode == "exit") std::exit(3);
    CHECK(false) << "rank 1 crashes on purpose";
  } else {
    comm->Recv(buffer, 1);
  }
  comm->stream().Synchronize();
  FAIL() << "rank " << rank << " outlived the failure (" << mode << ")";
}

}  // namespace
}  // namespace moe
#endif  // MOE_WITH_MPI
