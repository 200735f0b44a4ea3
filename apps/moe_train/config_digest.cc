#include "apps/moe_train/config_digest.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <sstream>

#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/run_flags.h"
#include "engine/io/dataset.h"

DECLARE_string(data_path);

namespace moe {
namespace {

// One entry a line, "name\tvalue" (neither holds a tab or a newline: gflags values are one
// line, and the command line refuses values with spaces around them).
std::string Serialize(const std::vector<DigestEntry>& digest) {
  std::string out;
  for (const DigestEntry& e : digest) out += e.name + "\t" + e.value + "\n";
  return out;
}

std::vector<DigestEntry> Parse(const std::string& text) {
  std::vector<DigestEntry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t tab = line.find('\t');
    out.push_back({line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1)});
  }
  return out;
}

// A value as the message shows it: an empty one as ''.
std::string Shown(const std::string& value) { return value.empty() ? "''" : value; }

std::string SizeText(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? "missing" : std::to_string(size) + " bytes";
}

}  // namespace

std::vector<DigestEntry> ConfigDigest() {
  std::vector<DigestEntry> digest;
  for (const FlagRow& row : FlagTable()) {
    if (std::find(std::begin(kFlagsOutsideDigest), std::end(kFlagsOutsideDigest),
                  std::string(row.name)) != std::end(kFlagsOutsideDigest)) {
      continue;
    }
    digest.push_back({"--" + std::string(row.name), FlagValueText(row.name)});
  }
  DataOptions data;
  data.format = FLAGS_data_format;
  data.path = FLAGS_data_path;
  for (const std::string& file : DataSourceFiles(data)) {
    digest.push_back({"the size of " + file + " (--data_path)", SizeText(file)});
  }
  return digest;
}

Status CompareWithRankZero(World& world, const std::vector<DigestEntry>& digest) {
  const std::vector<DigestEntry> zero = Parse(world.Broadcast(Serialize(digest), 0));
  if (world.rank() == 0) return Status::Ok();
  const std::string me = "rank " + std::to_string(world.rank());
  const std::string differs = me + " runs another configuration than rank 0: ";
  for (size_t i = 0; i < std::max(zero.size(), digest.size()); ++i) {
    if (i >= zero.size() || i >= digest.size() || zero[i].name != digest[i].name) {
      const std::string name = i < digest.size() ? digest[i].name : zero[i].name;
      return InvalidArgument(differs + name + " is known to only one of them (another build?)");
    }
    if (zero[i].value != digest[i].value) {
      return InvalidArgument(differs + digest[i].name + " is " + Shown(digest[i].value) + " on " +
                             me + ", " + Shown(zero[i].value) + " on rank 0");
    }
  }
  return Status::Ok();
}

}  // namespace moe
