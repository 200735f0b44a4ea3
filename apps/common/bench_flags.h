// The benchmarks' checked flags, all checked before any work (a mistyped flag never costs a
// run, and an output path is checked before the results exist). Each returns the value (or true),
// or prints one line on stderr naming the flag, prefixed by the program's name, and returns
// nullopt (or false); the caller exits 2.
//   BenchCommandLine: reads argv as moe_train does (apps/common/command_line.h: unknown flags,
//   malformed values and stray arguments refused); --help, -h and --helpshort print the flags
//   defined in `source` (the bench's main.cc), --helpfull every flag. Returns the code to exit
//   with (2: refused, 0: help printed), or nullopt to run.
//   BenchDevice: --device names "cpu", or "cuda" (GPU 0) when this machine has it.
//   BenchStateDType: a storage-dtype flag (--grads, --moments) names fp32 or bf16, as moe_train's
//   --main_grads_dtype and --exp_avg_dtype do (OptimizerDTypeFromName).
//   BenchInRange: an integer flag within [min, max].
//   BenchChoices / BenchCounts: a comma-separated list of at least one item, each one of the
//   choices / an integer within [min, max], none listed twice.
//   BenchOutputPath: a file to write at the end (empty: none), replacing an earlier one (whose
//   first bytes are `own_start`), as moe_train checks its trace file (CheckOwnOutputFile,
//   apps/common/output_checks.h).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gflags/gflags.h>

#include "apps/common/command_line.h"
#include "apps/common/output_checks.h"
#include "engine/autograd/parameters.h"
#include "engine/runtime/device_context.h"

namespace moe {

inline std::optional<Device> BenchDevice(const char* program, const std::string& flag) {
  if (flag != "cpu" && flag != "cuda") {
    fprintf(stderr, "%s: --device=%s must be cpu or cuda\n", program, flag.c_str());
    return std::nullopt;
  }
  const Device device = flag == "cpu" ? Device::CPU() : Device::CUDA(0);
  const Status available = CheckDeviceAvailable(device);
  if (!available.ok()) {
    fprintf(stderr, "%s: --device=%s: %s\n", program, flag.c_str(), available.message().c_str());
    return std::nullopt;
  }
  return device;
}

inline std::optional<DType> BenchStateDType(const char* program, const char* flag,
                                            const std::string& value) {
  const std::optional<DType> dtype = OptimizerDTypeFromName(value);
  if (!dtype) {
    fprintf(stderr, "%s: --%s=%s must be %s\n", program, flag, value.c_str(), kOptimizerDTypeNames);
  }
  return dtype;
}

inline bool BenchInRange(const char* program, const char* flag, int64_t value, int64_t min,
                         int64_t max) {
  if (value >= min && value <= max) return true;
  fprintf(stderr, "%s: --%s=%lld must be in [%lld, %lld]\n", program, flag, (long long)value,
          (long long)min, (long long)max);
  return false;
}

namespace bench_flags_detail {

inline std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) items.push_back(item);
  if (!text.empty() && text.back() == ',') items.emplace_back();  // getline drops it
  return items;
}

// An item listed twice (--paths=fused,fused would check a path against itself; --tokens=16,16
// times one case twice): one line naming it, as moe_train's lists say it (ParseNameList).
template <typename T>
bool NoRepeats(const char* program, const char* flag, const std::vector<T>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (std::find(items.begin(), items.begin() + i, items[i]) == items.begin() + i) continue;
    std::ostringstream item;
    item << items[i];
    fprintf(stderr, "%s: --%s lists %s twice\n", program, flag, item.str().c_str());
    return false;
  }
  return true;
}

}  // namespace bench_flags_detail

inline std::optional<std::vector<std::string>> BenchChoices(
    const char* program, const char* flag, const std::string& value,
    const std::vector<std::string>& choices) {
  const std::vector<std::string> items = bench_flags_detail::SplitList(value);
  const auto unknown = std::find_if(items.begin(), items.end(), [&](const std::string& item) {
    return std::find(choices.begin(), choices.end(), item) == choices.end();
  });
  if (!items.empty() && unknown == items.end()) {
    if (!bench_flags_detail::NoRepeats(program, flag, items)) return std::nullopt;
    return items;
  }
  std::string names;
  for (const std::string& choice : choices) names += (names.empty() ? "" : ", ") + choice;
  fprintf(stderr, "%s: --%s=%s must list one or more of %s, comma-separated\n", program, flag,
          value.c_str(), names.c_str());
  return std::nullopt;
}

inline std::optional<std::vector<int64_t>> BenchCounts(const char* program, const char* flag,
                                                       const std::string& value, int64_t min,
                                                       int64_t max) {
  std::vector<int64_t> counts;
  for (const std::string& item : bench_flags_detail::SplitList(value)) {
    int64_t count = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), count);
    if (error != std::errc() || end != item.data() + item.size() || count < min || count > max) {
      counts.clear();
      break;
    }
    counts.push_back(count);
  }
  if (!counts.empty()) {
    if (!bench_flags_detail::NoRepeats(program, flag, counts)) return std::nullopt;
    return counts;
  }
  fprintf(stderr, "%s: --%s=%s must list one or more integers in [%lld, %lld], comma-separated\n",
          program, flag, value.c_str(), (long long)min, (long long)max);
  return std::nullopt;
}

inline std::optional<int> BenchCommandLine(const char* program, const char* source, int argc,
                                           char** argv) {
  StatusOr<HelpRequest> parsed = ParseCommandLine(argc, argv);
  if (!parsed.ok()) {
    fprintf(stderr, "%s: %s\n", program, parsed.status().message().c_str());
    return 2;
  }
  switch (*parsed) {
    case HelpRequest::kNone:
      return std::nullopt;
    case HelpRequest::kHelp:
    case HelpRequest::kHelpShort:
      gflags::ShowUsageWithFlagsRestrict(argv[0], source);
      return 0;
    case HelpRequest::kHelpFull:
      gflags::ShowUsageWithFlags(argv[0]);
      return 0;
    case HelpRequest::kGflags:
      gflags::HandleCommandLineHelpFlags();  // --version, --helpxml, ...: exits
      return 0;
  }
  return 2;
}

inline bool BenchOutputPath(const char* program, const char* flag, const std::string& path,
                            std::string_view own_start) {
  const Status status = CheckOwnOutputFile(flag, path, own_start, "replace");
  if (!status.ok()) fprintf(stderr, "%s: %s\n", program, status.message().c_str());
  return status.ok();
}

}  // namespace moe
