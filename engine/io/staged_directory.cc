#include "engine/io/staged_directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <glog/logging.h>

#include "engine/io/durable_files.h"
#include "engine/io/quoted.h"

namespace moe {

namespace fs = std::filesystem;

Status StagedDirectory::CheckUnused(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::symlink_status(path, error);
  if (!fs::exists(status)) return Status::Ok();
  if (!fs::is_directory(status)) {
    return FailedPrecondition(Quoted(path) + " exists and is not a directory: nothing overwritten");
  }
  if (!fs::is_empty(path, error) || error) {
    return FailedPrecondition(Quoted(path) +
                              " exists and is not empty: nothing overwritten (give a new or empty "
                              "directory)");
  }
  return Status::Ok();
}

StatusOr<StagedDirectory> StagedDirectory::Create(const std::string& path) {
  MOE_RETURN_IF_ERROR(CheckUnused(path));
  fs::path final_path = fs::absolute(fs::path(path)).lexically_normal();
  if (!final_path.has_filename()) final_path = final_path.parent_path();  // "out/"
  std::error_code error;
  fs::create_directories(final_path.parent_path(), error);
  if (error) {
    return FailedPrecondition("cannot create " + Quoted(final_path.parent_path()) + ": " +
                              error.message());
  }
  std::string name = ".";  // appended, not "." + ...: GCC 12 warns (-Wrestrict) on that
  name += final_path.filename().string();
  name += ".tmp-" + std::to_string(::getpid());
  const fs::path staging = final_path.parent_path() / name;
  fs::remove_all(staging, error);  // this process's own leftover, if any
  if (!fs::create_directory(staging, error)) {
    return FailedPrecondition("cannot create " + Quoted(staging) + ": " +
                              (error ? error.message() : "it exists"));
  }
  return StagedDirectory(final_path.string(), staging.string());
}

StagedDirectory::StagedDirectory(std::string final_path, std::string staging)
    : final_(std::move(final_path)), staging_(std::move(staging)) {}

StagedDirectory::StagedDirectory(StagedDirectory&& other) noexcept
    : final_(std::move(other.final_)), staging_(std::exchange(other.staging_, "")) {}

StagedDirectory::~StagedDirectory() {
  if (staging_.empty()) return;
  std::error_code error;
  fs::remove_all(staging_, error);
}

Status StagedDirectory::WriteFile(const std::string& name, const std::string& content) const {
  return WriteFileDurably(staging_ + "/" + name, content);
}

Status StagedDirectory::Publish() {
  CHECK(!staging_.empty()) << "publish of " << final_ << " twice";
  MOE_RETURN_IF_ERROR(SyncDirectory(staging_));
  MOE_RETURN_IF_ERROR(CheckUnused(final_));
  // rename(2) replaces an empty directory and fails on a non-empty one (ENOTEMPTY), so an
  // output made there since CheckUnused is never replaced.
  if (::rename(staging_.c_str(), final_.c_str()) != 0) {
    return FailedPrecondition("cannot rename " + Quoted(staging_) + " to " + Quoted(final_) + ": " +
                              ErrnoText());
  }
  staging_.clear();
  return SyncDirectory(fs::path(final_).parent_path());
}

}  // namespace moe
