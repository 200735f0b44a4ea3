#include "engine/io/checkpoint_scan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/io/checkpoint.h"
#include "engine/io/quoted.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// The step of a step directory's name ("step_00000100" -> 100); -1 if it has too many digits to
// be one Save wrote.
int64_t StepOfName(const std::string& name) {
  const std::string digits = name.substr(name.find('_') + 1);
  return digits.size() > 18 ? -1 : std::stoll(digits);
}

// OK if root/name is complete (see the top), else why not.
Status CheckComplete(const std::string& root, const std::string& name) {
  return ReadStepDirectory((fs::path(root) / name).string()).status();
}

// Why `latest` (the file's content) names no step directory of `root`; "" if it names one.
std::string LatestNamesNone(const std::string& root, const std::string& latest) {
  const bool plain = !latest.empty() && latest != "." && latest != ".." &&
                     latest.find_first_of("/\n") == std::string::npos;
  if (!plain) return "'latest' does not hold a directory name";
  if (!IsCheckpointStepDirName(latest)) {
    return "'latest' names " + Quoted(latest) + ", which is not a step directory's name";
  }
  std::error_code ec;
  if (!fs::is_directory(fs::path(root) / latest, ec)) {
    return "'latest' names " + Quoted(latest) + ", which is not a directory";
  }
  return "";
}

// Why the complete step directory `chosen` was taken over `latest`, the one `latest` names.
std::string LatestPassedOver(const std::string& root, const std::string& latest,
                             const std::string& chosen) {
  const std::string none = LatestNamesNone(root, latest);
  if (!none.empty()) return none;
  const Status complete = CheckComplete(root, latest);
  if (!complete.ok()) {
    return "'latest' names " + latest + ", which is incomplete (" + complete.message() + ")";
  }
  return "'latest' names " + latest + ", older than the complete " + chosen +
         " (a save stopped before it updated 'latest')";
}

}  // namespace

CheckpointRootEntries ListCheckpointRoot(const std::string& root) {
  CheckpointRootEntries out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_error;
    if (name == kLatestCheckpointFile) {
      std::ifstream in(it->path(), std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      std::string latest = text.str();
      if (!latest.empty() && latest.back() == '\n') latest.pop_back();  // as Save writes it
      out.latest = latest;
    } else if (IsCheckpointTemporaryName(name)) {
      out.temporaries.push_back(name);
    } else if (IsCheckpointStepDirName(name) && it->is_directory(type_error)) {
      out.step_dirs.push_back(name);
    }
  }
  std::sort(out.step_dirs.begin(), out.step_dirs.end(),
            [](const std::string& a, const std::string& b) {
              const int64_t sa = StepOfName(a), sb = StepOfName(b);
              return sa != sb ? sa > sb : a > b;
            });
  std::sort(out.temporaries.begin(), out.temporaries.end());
  return out;
}

StatusOr<ResumeChoice> ChooseResumeDir(const std::string& root) {
  const CheckpointRootEntries entries = ListCheckpointRoot(root);
  std::string skipped;  // the newer incomplete directories passed over, with why
  for (const std::string& name : entries.step_dirs) {
    const Status complete = CheckComplete(root, name);
    if (!complete.ok()) {
      if (name != entries.latest) {
        skipped += "; " + name + " is incomplete (" + complete.message() + ")";
      }
      continue;
    }
    ResumeChoice choice{(fs::path(root) / name).string(), ""};
    if (entries.latest == name) {
      if (!skipped.empty())
        choice.note = root + ": resuming from " + name + " ('latest')" + skipped;
      return choice;
    }
    const std::string why =
        entries.latest ? LatestPassedOver(root, *entries.latest, name) : "it has no 'latest'";
    choice.note =
        root + ": resuming from " + name + ", its newest complete step directory: " + why + skipped;
    return choice;
  }
  if (entries.latest) {
    const std::string none = LatestNamesNone(root, *entries.latest);
    if (!none.empty()) return NotFound("checkpoint root " + Quoted(root) + ": " + none);
    return CheckComplete(root, *entries.latest);
  }
  if (!entries.step_dirs.empty()) {
    return DataLoss("checkpoint root " + Quoted(root) + " holds no complete step directory (" +
                    skipped.substr(2) + ")");
  }
  return FailedPrecondition(Quoted(root) +
                            " is neither a checkpoint root (no step directory) nor a step "
                            "directory (no 'state.json')");
}

StatusOr<std::vector<std::string>> RemoveCheckpointTemporaries(const std::string& root) {
  std::vector<std::string> removed = ListCheckpointRoot(root).temporaries;
  for (const std::string& name : removed) {
    std::error_code ec;
    fs::remove_all(fs::path(root) / name, ec);
    if (ec) {
      return FailedPrecondition("cannot remove " + Quoted((fs::path(root) / name).string()) +
                                ", a temporary of an interrupted save: " + ec.message());
    }
  }
  return removed;
}

}  // namespace moe
