#include "tests/testing/command.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>

#include <glog/logging.h>

namespace moe::testing {

CommandResult RunCommand(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  CHECK(pipe != nullptr) << command;
  CommandResult result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace moe::testing
