// Runs a shell command for tests that exercise whole programs (moe_train, mpirun jobs): its exit
// code and everything it wrote to stdout and stderr, interleaved (RunCommand) or apart
// (RunCommandSplit). ScopedTempDir gives a test a directory of its own, removed afterwards.
#pragma once

#include <string>
#include <vector>

namespace moe::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + signal if the command was killed
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;  // wall time
};

CommandResult RunCommand(const std::string& command);

struct SplitCommandResult {
  int exit_code = -1;  // 128 + signal if the command was killed
  std::string out;     // stdout
  std::string err;     // stderr
};

SplitCommandResult RunCommandSplit(const std::string& command);

// A new, empty directory with a unique name under the system's temporary directory; removed
// with everything in it when the object goes out of scope.
class ScopedTempDir {
 public:
  ScopedTempDir();
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Path(const std::string& name) const { return path_ + "/" + name; }
  // Every entry under the directory (recursively), relative, sorted: to check what a command
  // created or left.
  std::vector<std::string> List() const;

 private:
  std::string path_;
};

}  // namespace moe::testing
