#include "apps/common/output_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "engine/io/checkpoint_scan.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// A stand-in for the name `part` when probing whether it can be created: unique to this process
// (ranks probe the same paths at once) and as long as `part` (a name too long stays too long).
std::string ProbeName(const std::string& part) {
  std::string name = ".moe_probe-" + std::to_string(::getpid()) + "-";
  if (part.size() > name.size()) name.append(part.size() - name.size(), 'x');
  return name;
}

// "" if an entry can be created in the existing directory `dir`, else why not.
std::string ProbeDirectory(const fs::path& dir) {
  const fs::path probe = dir / ProbeName("");
  if (::mkdir(probe.c_str(), 0700) != 0) return std::strerror(errno);
  ::rmdir(probe.c_str());
  return "";
}

// Whether a failed creation's errno says the directory refuses new entries.
bool Unwritable(int error) { return error == EACCES || error == EPERM || error == EROFS; }

// The nearest existing ancestor of `path` (itself if it exists).
fs::path ExistingAncestor(const fs::path& path) {
  std::error_code error;
  fs::path at = fs::absolute(path, error);
  while (!fs::exists(at, error) && at.has_relative_path()) at = at.parent_path();
  return at;
}

// Refuses a directory-to-be whose nearest existing ancestor is not a directory, or whose missing
// components cannot be made there (permissions, a read-only filesystem, a name too long): their
// stand-ins (ProbeName) are made, one inside the other, and removed again. The path is taken as
// the OS will when the run creates it, component by component: not normalised, as "link/.."
// is the parent of the link's target, not the link's own directory.
Status CheckCreatable(const std::string& bad, const fs::path& path) {
  std::error_code error;
  const fs::path target = fs::absolute(path, error);
  const fs::path ancestor = ExistingAncestor(target);
  if (!fs::is_directory(ancestor, error)) {
    return InvalidArgument(bad + ": cannot create it: " + ancestor.string() +
                           " is not a directory");
  }
  std::vector<fs::path> made;
  int failed = 0;  // errno of the mkdir that failed
  fs::path at = ancestor;
  for (const fs::path& part : target.lexically_relative(ancestor)) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {  // the parent of a stand-in just made: nothing to make
      at /= part;
      continue;
    }
    at /= ProbeName(part.string());
    if (::mkdir(at.c_str(), 0700) != 0) {
      failed = errno;
      break;
    }
    made.push_back(at);
  }
  for (auto it = made.rbegin(); it != made.rend(); ++it) ::rmdir(it->c_str());
  if (failed == 0) return Status::Ok();
  if (made.empty() && Unwritable(failed)) {
    return InvalidArgument(bad + ": cannot create it: directory " + ancestor.string() +
                           " is not writable (" + std::strerror(failed) + ")");
  }
  return InvalidArgument(bad + ": cannot create it (" + std::string(std::strerror(failed)) + ")");
}

// The canonical form of a path for comparisons (whether or not it exists).
std::string Canonical(const std::string& path) {
  std::error_code error;
  const fs::path out = fs::weakly_canonical(fs::absolute(path, error), error);
  return error ? path : out.string();
}

}  // namespace

Status CheckOutputFile(const char* flag, const std::string& path) {
  if (path.empty()) return Status::Ok();
  const std::string bad = "--" + std::string(flag) + " " + path;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status)) {
    if (!fs::is_regular_file(status)) return InvalidArgument(bad + ": not a regular file");
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return InvalidArgument(bad + ": not writable (" + std::strerror(errno) + ")");
    ::close(fd);
    return Status::Ok();
  }
  if (path.back() == '/') return InvalidArgument(bad + ": names a directory");
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, error)) {
    return InvalidArgument(bad + ": directory " + parent.string() + " does not exist");
  }
  // A stand-in of the file's name is made and removed: its directory's permissions, a read-only
  // filesystem and a name too long all show.
  const fs::path probe = parent / ProbeName(fs::path(path).filename().string());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && Unwritable(errno)) {
    return InvalidArgument(bad + ": directory " + parent.string() + " is not writable (" +
                           std::strerror(errno) + ")");
  }
  if (fd < 0) return InvalidArgument(bad + ": cannot create it (" + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

Status CheckOwnOutputFile(const char* flag, const std::string& path, std::string_view own_start,
                          const char* writes) {
  MOE_RETURN_IF_ERROR(CheckOutputFile(flag, path));
  std::ifstream in(path, std::ios::binary);
  std::string start(own_start.size(), '\0');
  in.read(start.data(), static_cast<std::streamsize>(start.size()));
  if (in.gcount() == 0 || start == own_start) return Status::Ok();  // new, empty, or ours
  return InvalidArgument("--" + std::string(flag) + " " + path +
                         " exists and is not an output of this flag: refusing to " + writes +
                         " it (remove it, or name a new file)");
}

Status CheckOutputDirectory(const char* flag, const std::string& path) {
  if (path.empty()) return Status::Ok();
  const std::string bad = "--" + std::string(flag) + " " + path;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) return CheckCreatable(bad, path);
  if (!fs::is_directory(status)) return InvalidArgument(bad + " exists and is not a directory");
  const std::string why = ProbeDirectory(path);
  if (!why.empty()) return InvalidArgument(bad + ": directory is not writable (" + why + ")");
  return Status::Ok();
}

Status CheckSaveRoot(const std::string& root, const std::string& load) {
  if (root.empty()) return Status::Ok();
  // A step directory (one holding a state.json) is a checkpoint, not a root: saving there, or in
  // a directory below it, would nest a root of new checkpoints inside an earlier one.
  std::error_code error;
  for (fs::path at = ExistingAncestor(root);; at = at.parent_path()) {
    if (fs::is_regular_file(at / "state.json", error)) {
      const bool itself = SamePath(at.string(), root);
      return InvalidArgument("--save " + root + (itself ? " is" : " lies in") +
                             " a checkpoint's step directory" +
                             (itself ? "" : " (" + at.string() + ")") +
                             ": save to a checkpoint root or a new directory");
    }
    if (!at.has_relative_path()) break;
  }
  const CheckpointRootEntries entries = ListCheckpointRoot(root);
  if (entries.step_dirs.empty() && !entries.latest) return Status::Ok();
  const std::string newest = entries.step_dirs.empty() ? "latest" : entries.step_dirs.front();
  if (load.empty()) {
    const StatusOr<ResumeChoice> resumable = ChooseResumeDir(root);  // suggest only what works
    if (!resumable.ok()) {
      return InvalidArgument("--save " + root + " holds checkpoints, none of them complete (" +
                             resumable.status().message() +
                             "): remove them, or save to a new directory");
    }
    return InvalidArgument("--save " + root + " already holds checkpoints (up to " + newest +
                           "); resume with --load=" + root + ", or save to a new directory");
  }
  // --load is the root itself, or a step directory in it.
  const std::string canonical_root = Canonical(root);
  const std::string canonical_load = Canonical(load);
  if (canonical_load == canonical_root ||
      Canonical(fs::path(canonical_load).parent_path().string()) == canonical_root) {
    return Status::Ok();
  }
  return InvalidArgument("--save " + root + " already holds checkpoints (up to " + newest +
                         ") of another run than --load=" + load + "; save to a new directory");
}

bool SamePath(const std::string& a, const std::string& b) { return Canonical(a) == Canonical(b); }

}  // namespace moe
