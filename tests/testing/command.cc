#include "tests/testing/command.h"

#include <glog/logging.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace moe::testing {
namespace {

// Runs `command` with popen, returning its exit code and appending its stdout to `out`.
int RunWithPipe(const std::string& command, std::string* out) {
  FILE* pipe = popen(command.c_str(), "r");
  CHECK(pipe != nullptr) << command;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

CommandResult RunCommand(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  CommandResult result;
  result.exit_code = RunWithPipe(command + " 2>&1", &result.output);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

SplitCommandResult RunCommandSplit(const std::string& command) {
  const ScopedTempDir dir;
  const std::string err_path = dir.Path("stderr");
  SplitCommandResult result;
  // A subshell, so that a redirection inside `command` cannot take stderr from us.
  result.exit_code = RunWithPipe("( " + command + " ) 2>" + err_path, &result.out);
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  result.err = text.str();
  return result;
}

ScopedTempDir::ScopedTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "moe_test_XXXXXX").string();
  CHECK(mkdtemp(pattern.data()) != nullptr) << "mkdtemp " << pattern;
  path_ = pattern;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code error;
  std::filesystem::remove_all(path_, error);
}

std::vector<std::string> ScopedTempDir::List() const {
  std::vector<std::string> entries;
  std::error_code error;
  for (std::filesystem::recursive_directory_iterator it(path_, error), end; !error && it != end;
       it.increment(error)) {
    entries.push_back(std::filesystem::relative(it->path(), path_).string());
  }
  std::sort(entries.begin(), entries.end());
  return entries;
}

}  // namespace moe::testing
