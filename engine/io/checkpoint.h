// Checkpoint directories: named tensors plus a JSON document, saved so that a crash at any point
// never leaves a half-written checkpoint as the latest one.
//
//   root/
//     latest                  one line: the name of the step directory saved last
//     step_00000100/
//       model.safetensors     the `model` tensors      (safetensors.h; metadata step, format=pt)
//       optimizer.safetensors the `optimizer` tensors
//       state.json            the caller's JSON document, verbatim
//
// Save writes everything into root/.step_00000100.tmp-<pid>, fsyncs the files and the directory,
// renames it into place, fsyncs root, then replaces `latest` the same way (latest.tmp, fsync,
// rename). With `overwrite`, an existing step directory is swapped out atomically by
// renameat2(RENAME_EXCHANGE) (a local Linux filesystem: ext4, xfs, btrfs, tmpfs, overlayfs) and
// then removed. `latest` always names the checkpoint saved last. Leftover temporaries of
// interrupted saves (IsCheckpointTemporaryName) are never followed; a later save by the same pid
// removes its own, and the run that holds the root's lock removes them all (checkpoint_scan.h).
// One process (e.g. rank 0) saves to a root at a time.
//
// A step directory is complete when every file of it is whole (ReadStepDirectory: state.json
// parses as JSON, and each tensor file passes the reader's layout checks (its header is
// whole JSON, and its tensors fill the data exactly to the file's end, so a truncated file
// fails). Save publishes a directory only once all three are written and fsynced, so an
// incomplete one was damaged afterwards.
//
// Load accepts a root (its newest complete step directory, which is normally the one `latest`
// names: checkpoint_scan.h) or a step directory. Every expected tensor must be in the
// file with the expected shape, and the file must hold no others (LoadSafetensors' rules,
// including f32 <-> bf16 conversion and finite values only), unless `subset`
// (LoadSafetensorsSubset: a part of the model, such as one pipeline rank's stages, loads from a
// full checkpoint). On error, destinations loaded before the failure may already be written.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/io/named_tensor.h"
#include "engine/io/safetensors.h"

namespace moe {

// Creates `root` if missing. Refuses (FailedPrecondition) if root/step_<step> exists, unless
// `overwrite`. `step` >= 0.
Status SaveCheckpoint(const std::string& root, int64_t step, const std::vector<NamedTensor>& model,
                      const std::vector<NamedTensor>& optimizer, const nlohmann::json& state,
                      bool overwrite = false);
// Writes model.safetensors at `path` with `metadata` (a converter streaming it, say).
using ModelFileWriter =
    std::function<Status(const std::string& path, const SafetensorsMetadata& metadata)>;
// SaveCheckpoint with model.safetensors written by `write_model` (e.g. tensor by tensor by a
// SafetensorsWriter, never holding the model), everything else as SaveCheckpoint.
Status SaveCheckpointWith(const std::string& root, int64_t step, const ModelFileWriter& write_model,
                          const std::vector<NamedTensor>& optimizer, const nlohmann::json& state,
                          bool overwrite = false);

// The name of step `step`'s directory under a root: "step_00000100".
std::string CheckpointStepDirName(int64_t step);
// Whether `name` is named as step directories are: "step_" and digits only.
bool IsCheckpointStepDirName(const std::string& name);
// Whether `name` is one of Save's temporaries in a root: a step directory being written
// (".step_00000100.tmp-<pid>") or the next `latest` ("latest.tmp").
bool IsCheckpointTemporaryName(const std::string& name);
// The file of a root that names the step directory saved last.
inline constexpr const char* kLatestCheckpointFile = "latest";
// The file of a step directory that holds the model's tensors.
inline constexpr const char* kCheckpointModelFile = "model.safetensors";

// The step directory that `path` denotes: `path` itself if it holds a state.json, else the
// newest complete step directory of the root `path` (ChooseResumeDir, checkpoint_scan.h).
StatusOr<std::string> ResolveCheckpointDir(const std::string& path);

// The state.json of step directory `dir`, parsed, once its two tensor files' headers and layouts
// have passed the reader's checks (CheckSafetensorsLayout): OK when the directory is complete
// (see the top), else an error saying which file is not whole.
StatusOr<nlohmann::json> ReadStepDirectory(const std::string& dir);

// The step directory `path` denotes (ResolveCheckpointDir) and its state.json
// (ReadStepDirectory): for checks made before any tensor is allocated (model shape, step).
// `note` says why a root resolved to another step directory than its `latest` names ("" when
// it did not: ChooseResumeDir).
struct CheckpointState {
  std::string dir;
  nlohmann::json state;
  std::string note;
};
StatusOr<CheckpointState> ReadCheckpointState(const std::string& path);

// Loads model.safetensors and optimizer.safetensors of the resolved step directory into the
// given tensors and returns its state.json. With `subset`, the files may hold further tensors.
StatusOr<nlohmann::json> LoadCheckpoint(const std::string& path,
                                        const std::vector<NamedTensor>& model,
                                        const std::vector<NamedTensor>& optimizer,
                                        bool subset = false);
// LoadCheckpoint of model.safetensors alone (optimizer.safetensors is not opened): the weights,
// for a run that starts from them with a fresh optimizer (--finetune).
StatusOr<nlohmann::json> LoadCheckpointWeights(const std::string& path,
                                               const std::vector<NamedTensor>& model,
                                               bool subset = false);

}  // namespace moe
