// A shell command run in the background, for tests that act on a program while it runs (send it
// signals, stop one of its MPI ranks, start a second run beside it). Its stdout and stderr go,
// interleaved, to a file that Output reads at any time. The command runs in a process group of
// its own (with `exec`, so pid() is the command itself, e.g. mpirun); the destructor kills the
// group if it still runs.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace moe::testing {

class BackgroundCommand {
 public:
  // `output_path`: where stdout and stderr go (a file the test's temporary directory holds).
  BackgroundCommand(const std::string& command, const std::string& output_path);
  ~BackgroundCommand();
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;

  pid_t pid() const { return pid_; }
  // What the command has written so far.
  std::string Output() const;
  // Polls Output until it holds `text`; false if the command ended or `seconds` passed first.
  bool WaitForOutput(const std::string& text, double seconds);
  // Sends `signal` to the command (not to its group).
  void Signal(int signal) const;
  // Waits for the command to end: its exit code, or 128 + the signal that ended it; after
  // `seconds` the group is killed and -1 returned.
  int Wait(double seconds);
  // The command's child processes by their MPI rank (OMPI_COMM_WORLD_RANK in their environment):
  // the ranks, when the command is mpirun.
  std::map<int, pid_t> MpiRanks() const;

 private:
  // Reaps the command if it has ended (waits for that with `block`); true once it has.
  bool Reap(bool block);

  const std::string output_path_;
  pid_t pid_ = -1;
  bool running_ = true;
  int exit_code_ = -1;
};

}  // namespace moe::testing
