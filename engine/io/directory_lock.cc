#include "engine/io/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "engine/core/check.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// Whether flock's errno says the filesystem has no file locks (rather than that one is held).
bool LocksUnsupported(int error) {
  return error == ENOLCK || error == ENOSYS || error == EOPNOTSUPP || error == EINVAL;
}

// "process 1234 on host node7" from the holder's lock file. The holder writes it just after
// taking the lock, so an empty file is read again for a moment before giving up on the name.
std::string Holder(const fs::path& path) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    char text[512] = {};
    const ssize_t n = fd < 0 ? -1 : ::read(fd, text, sizeof(text) - 1);
    if (fd >= 0) ::close(fd);
    long long pid = 0;
    char host[256] = {};
    if (n > 0 && std::sscanf(text, "%lld %255s", &pid, host) == 2) {
      return "process " + std::to_string(pid) + " on host " + host;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "another process (its lock file names none)";
}

}  // namespace

StatusOr<std::unique_ptr<DirectoryLock>> DirectoryLock::Acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FailedPrecondition("cannot create " + dir + ": " + ec.message());
  const fs::path path = fs::path(dir) / kDirectoryLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return FailedPrecondition("cannot open the lock file " + path.string() + ": " +
                              std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd);
    if (error == EWOULDBLOCK) {
      return FailedPrecondition(dir + " is in use by " + Holder(path) + " (its lock file " +
                                path.string() + ")");
    }
    const std::string why = "cannot lock " + path.string() + ": " + std::strerror(error);
    if (!LocksUnsupported(error)) return FailedPrecondition(why);
    return std::unique_ptr<DirectoryLock>(new DirectoryLock(-1, why));
  }
  const std::string holder = std::to_string(::getpid()) + " " + HostName() + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return FailedPrecondition("cannot write the lock file " + path.string() + ": " + why);
  }
  return std::unique_ptr<DirectoryLock>(new DirectoryLock(fd, ""));
}

DirectoryLock::~DirectoryLock() {
  if (held()) ::close(fd_);
}

}  // namespace moe
