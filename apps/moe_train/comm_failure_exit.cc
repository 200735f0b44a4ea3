#include "apps/moe_train/comm_failure_exit.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "engine/distributed/comm_watchdog.h"

namespace moe {
namespace {

const char* exit_program = "";
std::atomic<int64_t> current_step{0};

// One line and exit 1, without running exit-time code: other threads are stuck in the failed
// communicator, and destructors would wait for them.
[[noreturn]] void ExitCommFailure(const std::string& message) {
  fflush(stdout);
  const long long step = current_step.load();
  if (step > 0) {
    fprintf(stderr, "%s: step %lld: %s\n", exit_program, step, message.c_str());
  } else {
    fprintf(stderr, "%s: before the first step: %s\n", exit_program, message.c_str());
  }
  fflush(stderr);
  _exit(1);
}

}  // namespace

void ExitOnCommFailure(const char* program) {
  exit_program = program;
  SetCommFailureHandler(&ExitCommFailure);
}

void SetCommFailureStep(int64_t step) { current_step.store(step); }

}  // namespace moe
