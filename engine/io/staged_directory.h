// StagedDirectory: an output directory that appears whole or not at all. Its files are written
// into a temporary sibling (PARENT/.NAME.tmp-<pid>), and Publish renames that into place, so an
// error or a crash never leaves a half-written output under the final name (only the hidden
// temporary, which the destructor removes unless the process died). The final path must not
// exist, or be an empty directory (which the rename replaces); anything else there is refused,
// and never written into or removed.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace moe {

class StagedDirectory {
 public:
  // OK when `path` is absent or an empty directory (FailedPrecondition otherwise, naming it): for
  // a check before any work.
  static Status CheckUnused(const std::string& path);
  // CheckUnused, then creates the parent directories and the temporary.
  static StatusOr<StagedDirectory> Create(const std::string& path);
  StagedDirectory(StagedDirectory&& other) noexcept;
  StagedDirectory& operator=(StagedDirectory&&) = delete;
  ~StagedDirectory();  // removes the temporary unless published

  // The temporary directory, to write the output into.
  const std::string& path() const { return staging_; }
  // Writes `content` to path()/name and fsyncs it.
  Status WriteFile(const std::string& name, const std::string& content) const;
  // Fsyncs the temporary, renames it to the final path and fsyncs the parent. Refused when the
  // final path has become something other than an absent path or an empty directory meanwhile.
  Status Publish();

 private:
  StagedDirectory(std::string final_path, std::string staging);
  std::string final_;
  std::string staging_;  // "" once published or moved from
};

}  // namespace moe
