#include "engine/io/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <glog/logging.h>

#include "engine/io/checkpoint_scan.h"
#include "engine/io/durable_files.h"
#include "engine/io/quoted.h"
#include "engine/io/safetensors.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLatest = kLatestCheckpointFile;
constexpr const char* kLatestTemporary = "latest.tmp";
constexpr const char* kTemporaryStepMark = ".tmp-";  // .step_00000100.tmp-<pid>
constexpr const char* kModelFile = kCheckpointModelFile;
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";

Status Rename(const fs::path& from, const fs::path& to, unsigned int flags) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) != 0) {
    return Internal("cannot rename " + Quoted(from) + " to " + Quoted(to) + ": " + ErrnoText());
  }
  return Status::Ok();
}

// Fills `dir` (which exists and is empty) with the checkpoint files and makes them durable.
Status WriteStepFiles(const fs::path& dir, int64_t step, const ModelFileWriter& write_model,
                      const std::vector<NamedTensor>& optimizer, const nlohmann::json& state) {
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"step", std::to_string(step)}};
  MOE_RETURN_IF_ERROR(write_model((dir / kModelFile).string(), metadata));
  MOE_RETURN_IF_ERROR(WriteSafetensors((dir / kOptimizerFile).string(), optimizer, metadata));
  MOE_RETURN_IF_ERROR(WriteFileDurably(dir / kStateFile, state.dump(2) + "\n"));
  return SyncDirectory(dir);
}

// Moves the finished `tmp` directory to `final_dir`. An existing `final_dir` is exchanged
// atomically with `tmp` (renameat2 RENAME_EXCHANGE) and then removed, so `final_dir` is complete
// at every instant.
Status PublishDirectory(const fs::path& tmp, const fs::path& final_dir, bool replace) {
  if (!replace) return Rename(tmp, final_dir, 0);
  MOE_RETURN_IF_ERROR(Rename(tmp, final_dir, RENAME_EXCHANGE));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) {
    return Internal("saved " + Quoted(final_dir) + " but cannot remove the replaced copy " +
                    Quoted(tmp) + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace

std::string CheckpointStepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

bool IsCheckpointStepDirName(const std::string& name) {
  const std::string prefix = "step_";
  return name.size() > prefix.size() && name.rfind(prefix, 0) == 0 &&
         name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

bool IsCheckpointTemporaryName(const std::string& name) {
  if (name == kLatestTemporary) return true;
  const size_t mark = name.find(kTemporaryStepMark);
  if (name.empty() || name[0] != '.' || mark == std::string::npos) return false;
  const std::string pid = name.substr(mark + std::strlen(kTemporaryStepMark));
  return IsCheckpointStepDirName(name.substr(1, mark - 1)) && !pid.empty() &&
         pid.find_first_not_of("0123456789") == std::string::npos;
}

Status SaveCheckpoint(const std::string& root, int64_t step, const std::vector<NamedTensor>& model,
                      const std::vector<NamedTensor>& optimizer, const nlohmann::json& state,
                      bool overwrite) {
  const ModelFileWriter write_model = [&](const std::string& path,
                                          const SafetensorsMetadata& metadata) {
    return WriteSafetensors(path, model, metadata);
  };
  return SaveCheckpointWith(root, step, write_model, optimizer, state, overwrite);
}

Status SaveCheckpointWith(const std::string& root, int64_t step, const ModelFileWriter& write_model,
                          const std::vector<NamedTensor>& optimizer, const nlohmann::json& state,
                          bool overwrite) {
  CHECK_GE(step, 0) << "checkpoint step";
  const fs::path root_dir(root);
  std::error_code ec;
  if (fs::exists(root_dir, ec) && !fs::is_directory(root_dir, ec)) {
    return FailedPrecondition("checkpoint root " + Quoted(root_dir) + " is not a directory");
  }
  fs::create_directories(root_dir, ec);
  if (ec) {
    return FailedPrecondition("cannot create checkpoint root " + Quoted(root_dir) + ": " +
                              ec.message());
  }
  const std::string name = CheckpointStepDirName(step);
  const fs::path final_dir = root_dir / name;
  const bool exists = fs::exists(final_dir, ec);
  if (exists && !overwrite) {
    return FailedPrecondition("checkpoint " + Quoted(final_dir) +
                              " already exists; refusing to overwrite it");
  }

  const fs::path tmp = root_dir / ("." + name + kTemporaryStepMark + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);  // our own leftover from an earlier failed save, if any
  if (!fs::create_directory(tmp, ec)) {
    return FailedPrecondition("cannot write to checkpoint root " + Quoted(root_dir) + ": " +
                              (ec ? ec.message() : Quoted(tmp) + " exists"));
  }
  Status status = WriteStepFiles(tmp, step, write_model, optimizer, state);
  if (status.ok()) status = PublishDirectory(tmp, final_dir, exists);
  if (!status.ok()) {
    fs::remove_all(tmp, ec);
    return status;
  }
  MOE_RETURN_IF_ERROR(SyncDirectory(root_dir));

  const fs::path latest_tmp = root_dir / kLatestTemporary;
  MOE_RETURN_IF_ERROR(WriteFileDurably(latest_tmp, name + "\n"));
  MOE_RETURN_IF_ERROR(Rename(latest_tmp, root_dir / kLatest, 0));
  return SyncDirectory(root_dir);
}

namespace {

// The step directory `path` denotes, and why a root's is not the one its `latest` names.
StatusOr<ResumeChoice> Resolve(const std::string& path) {
  const fs::path dir(path);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return NotFound("checkpoint " + Quoted(dir) + " does not exist");
  if (fs::is_regular_file(dir / kStateFile, ec)) return ResumeChoice{dir.string(), ""};
  return ChooseResumeDir(path);
}

}  // namespace

StatusOr<std::string> ResolveCheckpointDir(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(ResumeChoice choice, Resolve(path));
  return std::move(choice.dir);
}

namespace {

// The state.json of step directory `dir`, parsed (no tensor file is opened).
StatusOr<nlohmann::json> ParseStateFile(const fs::path& dir) {
  std::ifstream in(dir / kStateFile);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return DataLoss("cannot read " + Quoted(dir / kStateFile));
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(Quoted(dir / kStateFile) + " is not valid JSON: " + e.what());
  }
}

}  // namespace

StatusOr<nlohmann::json> ReadStepDirectory(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(nlohmann::json state, ParseStateFile(dir));
  for (const char* file : {kModelFile, kOptimizerFile}) {
    MOE_RETURN_IF_ERROR(CheckSafetensorsLayout((fs::path(dir) / file).string()));
  }
  return state;
}

StatusOr<CheckpointState> ReadCheckpointState(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(ResumeChoice choice, Resolve(path));
  MOE_ASSIGN_OR_RETURN(nlohmann::json state, ReadStepDirectory(choice.dir));
  return CheckpointState{std::move(choice.dir), std::move(state), std::move(choice.note)};
}

namespace {

// LoadCheckpoint, and with `optimizer` null LoadCheckpointWeights.
StatusOr<nlohmann::json> LoadFiles(const std::string& path, const std::vector<NamedTensor>& model,
                                   const std::vector<NamedTensor>* optimizer, bool subset) {
  // The loads below run the layout checks as they open the files (per bucket under the
  // distributed optimizer): ReadStepDirectory's would be a second pass.
  MOE_ASSIGN_OR_RETURN(const ResumeChoice choice, Resolve(path));
  const fs::path dir(choice.dir);
  MOE_ASSIGN_OR_RETURN(nlohmann::json state, ParseStateFile(dir));
  const auto load = subset ? LoadSafetensorsSubset : LoadSafetensors;
  MOE_RETURN_IF_ERROR(load((dir / kModelFile).string(), model, NonFiniteValues::kRefuse));
  if (optimizer != nullptr) {
    MOE_RETURN_IF_ERROR(
        load((dir / kOptimizerFile).string(), *optimizer, NonFiniteValues::kRefuse));
  }
  return state;
}

}  // namespace

StatusOr<nlohmann::json> LoadCheckpoint(const std::string& path,
                                        const std::vector<NamedTensor>& model,
                                        const std::vector<NamedTensor>& optimizer, bool subset) {
  return LoadFiles(path, model, &optimizer, subset);
}

StatusOr<nlohmann::json> LoadCheckpointWeights(const std::string& path,
                                               const std::vector<NamedTensor>& model, bool subset) {
  return LoadFiles(path, model, nullptr, subset);
}

}  // namespace moe
