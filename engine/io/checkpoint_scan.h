// What a checkpoint root (engine/io/checkpoint.h) holds, read without loading any tensor: its
// step directories and `latest`, which step directory a resume takes, and the temporaries that
// interrupted saves left behind.
//
// Complete: a step directory is complete when ReadStepDirectory accepts it (checkpoint.h: its
// state.json parses and both tensor files are whole: their headers parse and their tensors fill
// the data exactly to the end of the file). Save writes all three files into a temporary
// directory, fsyncs them and only then renames it into place, so a published step directory is
// complete unless something damaged it later.
//
// Resume: a root resumes from its newest complete step directory. That is normally the one
// `latest` names; when it is not, the choice comes with a note saying why: `latest` is missing
// (the first save was interrupted between publishing its directory and writing `latest`), names
// an older directory (a later save was interrupted the same way), or names an incomplete or
// missing one (then the newest complete one before it is taken).
//
// Temporaries: only the process that holds the root's lock (directory_lock.h) may remove them,
// as any other process's save could still be writing one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace moe {

struct CheckpointRootEntries {
  std::vector<std::string> step_dirs;    // "step_00000100", ..., newest (highest step) first
  std::optional<std::string> latest;     // what `latest` holds, less its "\n", if it exists
  std::vector<std::string> temporaries;  // IsCheckpointTemporaryName, sorted
};
// Empty if `root` is not a directory.
CheckpointRootEntries ListCheckpointRoot(const std::string& root);

struct ResumeChoice {
  std::string dir;   // root/step_XXXXXXXX
  std::string note;  // why it is not the one `latest` names; "" when it is
};
// The newest complete step directory of `root`. None complete: the error of the one `latest`
// names (when it exists), else of the newest step directory, else that `root` holds none.
StatusOr<ResumeChoice> ChooseResumeDir(const std::string& root);

// Removes every temporary of `root` and returns their names (empty if there were none).
StatusOr<std::vector<std::string>> RemoveCheckpointTemporaries(const std::string& root);

}  // namespace moe
