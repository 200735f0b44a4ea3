#include "apps/common/command_line.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace moe {
namespace {

constexpr int kMaxFlagfileDepth = 16;
constexpr std::uintmax_t kMaxFlagfileBytes = 1 << 20;

// gflags' own help flags that gflags::HandleCommandLineHelpFlags answers.
const std::set<std::string>& GflagsHelpFlags() {
  static const std::set<std::string> kNames = {"helpon", "helpmatch", "helppackage", "helpxml",
                                               "version"};
  return kNames;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean --x?)" for the nearest flag within a few edits, else "".
std::string Suggestion(const std::string& name) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const auto& flag : flags) {
    const size_t distance = EditDistance(name, flag.name);
    if (distance < best_distance) {
      best_distance = distance;
      best = flag.name;
    }
  }
  return best.empty() ? "" : " (did you mean --" + best + "?)";
}

class Parser {
 public:
  explicit Parser(std::string program) : program_(std::move(program)) {}
  // `where`: "" for the command line, "FILE:LINE: " for a flagfile line.
  Status Flag(const std::string& where, const std::string& argument, const std::string* next,
              bool* used_next, int depth);
  HelpRequest help() const { return help_; }

 private:
  Status Flagfiles(const std::string& where, const std::string& list, int depth);
  Status Flagfile(const std::string& where, const std::string& path, int depth);

  std::string program_;
  HelpRequest help_ = HelpRequest::kNone;
};

Status Parser::Flag(const std::string& where, const std::string& argument, const std::string* next,
                    bool* used_next, int depth) {
  // argument starts with '-' and is not "-" or "--".
  const size_t dashes = argument.rfind("--", 0) == 0 ? 2 : 1;
  const size_t equals = argument.find('=');
  std::string name =
      argument.substr(dashes, equals == std::string::npos ? std::string::npos : equals - dashes);
  const bool has_value = equals != std::string::npos;
  std::string value = has_value ? argument.substr(equals + 1) : "";
  const std::string shown = "--" + name;
  if (name.empty()) return InvalidArgument(where + "'" + argument + "' is not a flag");

  if (name == "flagfile") {
    if (!has_value) {
      if (next == nullptr) return InvalidArgument(where + "--flagfile needs a file name");
      value = *next;
      *used_next = true;
    }
    return Flagfiles(where, value, depth);
  }
  if (name == "fromenv" || name == "tryfromenv" || name == "undefok") {
    return InvalidArgument(where + shown + " is not supported by " + program_);
  }

  gflags::CommandLineFlagInfo info;
  bool negated = false;
  if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
    // --noNAME for a bool flag NAME.
    if (!has_value && name.rfind("no", 0) == 0 &&
        gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) && info.type == "bool") {
      negated = true;
      name = name.substr(2);
    } else {
      return InvalidArgument(where + "unknown flag " + shown + Suggestion(name));
    }
  }
  if (info.type == "bool" && !has_value) value = negated ? "false" : "true";
  if (info.type != "bool" && !has_value) {
    if (next == nullptr || !where.empty()) {
      return InvalidArgument(where + shown + " needs a value (" + shown + "=VALUE)");
    }
    value = *next;
    *used_next = true;
  }
  // A value with spaces around it (a quoted "2 " or " ckpt") is a typo, not a name to create or
  // a number gflags would take half of: refused for every flag.
  if (!value.empty() && (std::isspace(static_cast<unsigned char>(value.front())) ||
                         std::isspace(static_cast<unsigned char>(value.back())))) {
    return InvalidArgument(where + shown + "='" + value +
                           "' has spaces around its value (remove them)");
  }
  // A value holding " --" is two flags in one argument (a quoting slip: --save="ck --load=old"
  // would save into a directory named so), not a path or list anyone means.
  for (size_t i = 0; i + 2 < value.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(value[i])) && value.compare(i + 1, 2, "--") == 0) {
      return InvalidArgument(where + shown + "='" + value + "' holds another flag ('" +
                             value.substr(i + 1) + "'): give each flag its own argument");
    }
  }
  if (name == "help" || name == "helpshort" || name == "helpfull") {
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      return InvalidArgument(where + shown + "=" + value + " is not a valid bool");
    }
    // Leave the flag itself unset for gflags: the program answers these.
    gflags::SetCommandLineOption(name.c_str(), "false");
    if (value == "false" || value == "0" || value == "no" || value == "f" || value == "n") {
      return Status::Ok();
    }
    help_ = name == "help"        ? HelpRequest::kHelp
            : name == "helpshort" ? HelpRequest::kHelpShort
                                  : HelpRequest::kHelpFull;
    return Status::Ok();
  }
  if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
    return InvalidArgument(where + shown + "=" + value + " is not a valid " + info.type);
  }
  // gflags' help flags ask for help only when set to true (bools) or to a name (--helpon=NAME):
  // --version=false or --helpon= run as if not given (gflags would print nothing and exit 0).
  if (GflagsHelpFlags().count(name) && help_ == HelpRequest::kNone) {
    const std::string now = gflags::GetCommandLineFlagInfoOrDie(name.c_str()).current_value;
    if (now != "false" && !now.empty()) help_ = HelpRequest::kGflags;
  }
  return Status::Ok();
}

Status Parser::Flagfiles(const std::string& where, const std::string& list, int depth) {
  if (list.empty()) return InvalidArgument(where + "--flagfile needs a file name");
  if (list.front() == ',' || list.back() == ',' || list.find(",,") != std::string::npos) {
    return InvalidArgument(where + "--flagfile=" + list + " has an empty entry");
  }
  std::stringstream files(list);
  std::string path;
  while (std::getline(files, path, ',')) MOE_RETURN_IF_ERROR(Flagfile(where, path, depth + 1));
  return Status::Ok();
}

Status Parser::Flagfile(const std::string& where, const std::string& path, int depth) {
  namespace fs = std::filesystem;
  const std::string bad = where + "--flagfile=" + path;
  if (depth > kMaxFlagfileDepth) {
    return InvalidArgument(bad + ": flagfiles nest deeper than " +
                           std::to_string(kMaxFlagfileDepth) + " (a cycle?)");
  }
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) return InvalidArgument(bad + ": no such file");
  if (fs::is_directory(status)) return InvalidArgument(bad + " is a directory, not a flagfile");
  if (!fs::is_regular_file(status)) return InvalidArgument(bad + " is not a regular file");
  const std::uintmax_t size = fs::file_size(path, error);
  if (error || size > kMaxFlagfileBytes) {
    return InvalidArgument(bad + " is over 1 MiB: not a flagfile");
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return InvalidArgument(bad + ": cannot read it");
  // A UTF-8 byte-order mark (some editors write one) is not part of the first line.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') {
      char byte[8];
      snprintf(byte, sizeof(byte), "0x%02x", c);
      return InvalidArgument(bad + " is not a text flagfile (byte " + byte + " at offset " +
                             std::to_string(i) + ")");
    }
  }
  std::stringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    line = line.substr(begin, line.find_last_not_of(" \t\r") + 1 - begin);
    const std::string here = path + ":" + std::to_string(number) + ": ";
    if (line[0] != '-' || line == "-" || line == "--") {
      return InvalidArgument(here + "'" + line +
                             "' is not a flag (flagfile lines are --name=value or # comments)");
    }
    // "--save=ckpt  # note": the comment would be part of the value (a directory named so).
    const size_t comment = line.find('#');
    if (comment != std::string::npos && comment > 0 &&
        std::isspace(static_cast<unsigned char>(line[comment - 1]))) {
      return InvalidArgument(here + "'" + line +
                             "': a comment must be a line of its own (# at its start)");
    }
    bool unused = false;
    MOE_RETURN_IF_ERROR(Flag(here, line, nullptr, &unused, depth));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<HelpRequest> ParseCommandLine(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // A help request anywhere on the command line wins over everything else on it.
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "-h" || arg == "-help" || arg == "--help") return HelpRequest::kHelp;
    if (arg == "-helpshort" || arg == "--helpshort") return HelpRequest::kHelpShort;
    if (arg == "-helpfull" || arg == "--helpfull") return HelpRequest::kHelpFull;
  }
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  Parser parser(program);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      if (i + 1 < args.size()) {
        return InvalidArgument("unexpected argument '" + args[i + 1] + "' after -- (" + program +
                               " takes no positional arguments)");
      }
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") {
      return InvalidArgument("unexpected argument '" + arg +
                             "' (flags are --name=value; a flagfile is --flagfile=FILE)");
    }
    bool used_next = false;
    const std::string* next = i + 1 < args.size() ? &args[i + 1] : nullptr;
    MOE_RETURN_IF_ERROR(parser.Flag("", arg, next, &used_next, 0));
    if (used_next) ++i;
  }
  return parser.help();
}

}  // namespace moe
