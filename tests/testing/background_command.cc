#include "tests/testing/background_command.h"

#include <glog/logging.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace moe::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The parent pid in /proc/<pid>/stat (the field after the command name in parentheses).
pid_t ParentOf(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  char state;
  pid_t parent = -1;
  fields >> state >> parent;
  return parent;
}

}  // namespace

BackgroundCommand::BackgroundCommand(const std::string& command, const std::string& output_path)
    : output_path_(output_path) {
  const std::string shell = "exec " + command + " > " + output_path + " 2>&1";
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  const char* argv[] = {"/bin/sh", "-c", shell.c_str(), nullptr};
  CHECK_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, &attributes, const_cast<char**>(argv), environ),
           0)
      << command;
  posix_spawnattr_destroy(&attributes);
}

BackgroundCommand::~BackgroundCommand() {
  if (running_) Wait(0);
}

bool BackgroundCommand::Reap(bool block) {
  if (!running_) return true;
  int status = 0;
  if (waitpid(pid_, &status, block ? 0 : WNOHANG) != pid_) return false;
  running_ = false;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

std::string BackgroundCommand::Output() const { return ReadAll(output_path_); }

bool BackgroundCommand::WaitForOutput(const std::string& text, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    const bool ended = Reap(false);
    if (Output().find(text) != std::string::npos) return true;
    if (ended) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void BackgroundCommand::Signal(int signal) const {
  if (running_) kill(pid_, signal);
}

int BackgroundCommand::Wait(double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!Reap(false)) {
    if (Clock::now() >= deadline) {
      kill(-pid_, SIGKILL);
      Reap(true);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

std::map<int, pid_t> BackgroundCommand::MpiRanks() const {
  std::map<int, pid_t> ranks;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ParentOf(ReadAll(entry.path() / "stat")) != pid_) continue;
    const std::string environment = ReadAll(entry.path() / "environ");
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    for (size_t at = 0; at < environment.size(); at = environment.find('\0', at) + 1) {
      if (environment.compare(at, key.size(), key) == 0) {
        ranks[std::stoi(environment.substr(at + key.size()))] = std::stoi(name);
        break;
      }
      if (environment.find('\0', at) == std::string::npos) break;
    }
  }
  return ranks;
}

}  // namespace moe::testing
