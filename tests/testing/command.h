// Runs a shell command for tests that exercise whole programs (moe_train, mpirun jobs): its exit
// code and everything it wrote to stdout and stderr.
#pragma once

#include <string>

namespace moe::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + signal if the command was killed
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;  // wall time
};

CommandResult RunCommand(const std::string& command);

}  // namespace moe::testing
