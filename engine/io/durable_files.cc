#include "engine/io/durable_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/io/quoted.h"

namespace moe {

std::string ErrnoText() { return std::strerror(errno); }

Status WriteFileDurably(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FailedPrecondition("cannot create " + Quoted(path) + ": " + ErrnoText());
  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
  bool ok = left == 0 && ::fsync(fd) == 0;
  std::string error = ok ? "" : ErrnoText();
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = ErrnoText();
  }
  if (!ok) return Internal("cannot write " + Quoted(path) + ": " + error);
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Internal("cannot open directory " + Quoted(dir) + ": " + ErrnoText());
  const bool ok = ::fsync(fd) == 0;
  const std::string error = ok ? "" : ErrnoText();
  ::close(fd);
  if (!ok) return Internal("cannot sync directory " + Quoted(dir) + ": " + error);
  return Status::Ok();
}

}  // namespace moe
