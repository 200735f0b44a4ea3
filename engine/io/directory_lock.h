// DirectoryLock: one writer per directory (e.g. a checkpoint root), held for a process's life.
//
// Acquire creates the directory if missing, opens (creating) its lock file, `.lock`, and takes an
// exclusive flock(2) on it without waiting. The lock belongs to the open file, so the kernel
// releases it when the process ends in any way (exit, crash, SIGKILL): a killed run leaves no
// stale lock, and the file itself staying behind means nothing. The holder writes "<pid> <host>"
// into the file, so that a refused process can name it: Acquire returns FailedPrecondition
// "DIR is in use by process 1234 on host node7 (its lock file DIR/.lock)". The descriptor is
// close-on-exec, so no child process inherits the lock.
//
// flock works on local filesystems and on NFS (v4, and v3 through the client's lock manager);
// Lustre needs its `flock` mount option. On a filesystem without file locks Acquire returns an
// unheld lock that says why (held() false, unheld_reason()), for the caller to report: refusing
// every run there would be worse than running unlocked.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "engine/core/status.h"

namespace moe {

inline constexpr const char* kDirectoryLockFile = ".lock";

class DirectoryLock {
 public:
  static StatusOr<std::unique_ptr<DirectoryLock>> Acquire(const std::string& dir);
  ~DirectoryLock();  // releases the lock (the file stays)
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  bool held() const { return fd_ >= 0; }
  // Why the lock is not held: "cannot lock DIR/.lock: Function not implemented"; "" if held.
  const std::string& unheld_reason() const { return unheld_reason_; }

 private:
  DirectoryLock(int fd, std::string unheld_reason)
      : fd_(fd), unheld_reason_(std::move(unheld_reason)) {}

  const int fd_;  // -1 when not held
  const std::string unheld_reason_;
};

}  // namespace moe
