// Output paths (moe_train's, the benchmarks'), checked before any work and without leaving
// anything behind: a run must never fail after its work because of where it writes.
//
// - --metrics_file, --trace_file: empty (no output), an existing regular file that opens for
//   appending, or a new name in an existing directory where a file can be created.
// - --metrics_file (appended to), --trace_file (every rank's) and moe_bench --json_out (replaced
//   whole when written): an existing non-empty file must also begin as that output begins (a
//   mistyped path to another file, the token data, a checkpoint or a flagfile, is refused rather
//   than destroyed or appended to).
// - --save: empty, an existing directory where entries can be created, or a path whose nearest
//   existing ancestor is such a directory (Save creates the rest). A root that already holds
//   checkpoints (step_XXXXXXXX/ or latest) is refused unless --load resumes from it (the root
//   or one of its step directories): a new run would replace the earlier run's checkpoints. The
//   refusal suggests --load only when the root has a complete step directory to resume from. A
//   checkpoint's step directory (it holds a state.json), or a path inside one, is refused too.
// - --dump_reference_case: like --save, without the checkpoint rule.
// - moe_train also refuses two of them naming the same path (SamePath;
// apps/moe_train/run_flags.cc). "Can be created" is tried, not inferred from permission bits (root
// passes every access() check, a read-only filesystem fails none of them) or from name lengths: for
// each name to be created, a stand-in of the same length, unique to the process, is made where it
// would be (directories one inside the other) and removed.
#pragma once

#include <string>
#include <string_view>

#include "engine/core/status.h"

namespace moe {

// An output file's path: see above. `flag` names it in the message ("metrics_file").
Status CheckOutputFile(const char* flag, const std::string& path);
// An output file that this output replaces or appends to (`writes`: "replace", "append to"):
// CheckOutputFile's rules, and an existing non-empty file must begin with `own_start`, the first
// bytes of what this output writes.
Status CheckOwnOutputFile(const char* flag, const std::string& path, std::string_view own_start,
                          const char* writes);
// A directory to be created or written into (--save, --dump_reference_case).
Status CheckOutputDirectory(const char* flag, const std::string& path);
// --save's checkpoint rule: refuses a root holding checkpoints unless `load` resumes from it.
Status CheckSaveRoot(const std::string& root, const std::string& load);
// Whether two paths, existing or not, name the same file or directory.
bool SamePath(const std::string& a, const std::string& b);

}  // namespace moe
