// The preset flagfiles (configs/*.flags) against the model presets (modules/model_presets.h) and
// against what moe_train prints for them. Each file, read as moe_train reads it (ParseCommandLine,
// then ValidateFlags, after the files it is used after), sets its preset's model exactly. Its
// header comment quotes lines of moe_train's start-up summary for that run, exactly as
// run_summary.h makes them: "# model: ..." and "# parameters: ..." (the counts of the printed
// line, up to its ';') where the file sets a model, "# batch: ..." where it sets the batch; a
// quote goes on over the lines after it that begin "#   ". Any other figure in a header is a
// value of the run's flags: a measurement (a time, a rate, a peak, a date) belongs on a results
// page, not in a preset.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "apps/common/command_line.h"
#include "apps/moe_train/run_flags.h"
#include "apps/moe_train/run_summary.h"
#include "modules/model_presets.h"
#include "modules/model_shape.h"
#include "tests/testing/source_tree.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// The source tree's configs/ (this file is tests/apps/presets_test.cc).
const fs::path kConfigs = testing::ConfigPath();

struct PresetFile {
  std::vector<std::string> flagfiles;  // as given to moe_train; the last is the one checked
  std::string preset;                  // the run's model
  std::set<std::string> quotes;        // the summary lines its header must quote
};

void PrintTo(const PresetFile& file, std::ostream* os) { *os << file.flagfiles.back(); }

const std::vector<PresetFile>& PresetFiles() {
  static const std::vector<PresetFile> kFiles = {
      {{"tiny.flags"}, "tiny", {"model", "parameters"}},
      {{"moe_100m.flags"}, "moe_100m", {"model", "parameters"}},
      {{"qwen3_moe_8layer.flags"}, "qwen3_moe_8layer", {"model", "parameters"}},
      {{"qwen3_moe_8layer.flags", "qwen3_moe_8layer_mb28.flags"}, "qwen3_moe_8layer", {"batch"}},
      {{"qwen3_30b_a3b.flags"}, "qwen3_30b_a3b", {"model", "parameters"}},
      {{"qwen3_30b_a3b_8layer.flags"}, "qwen3_30b_a3b_8layer", {"model", "parameters"}},
      {{"mixtral_8x7b.flags"}, "mixtral_8x7b", {"model", "parameters"}},
      {{"olmoe_1b_7b.flags"}, "olmoe_1b_7b", {"model", "parameters"}},
  };
  return kFiles;
}

std::vector<std::string> Lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A header: its quotes of summary lines by name, and the rest of its text.
struct Header {
  std::map<std::string, std::string> quotes;
  std::string text;
};

Header ReadHeader(const fs::path& path) {
  static const std::regex kQuote(R"(^# (model|parameters|batch): (.*)$)");
  Header header;
  std::string* quote = nullptr;  // the quote that a "#   " line continues
  for (const std::string& line : Lines(path)) {
    if (line.rfind("#", 0) != 0) break;
    std::smatch match;
    if (std::regex_match(line, match, kQuote)) {
      quote = &header.quotes[match[1]];
      *quote = match[2];
    } else if (quote != nullptr && line.rfind("#   ", 0) == 0) {
      quote->append(" ").append(line, line.find_first_not_of("# "));
    } else {
      quote = nullptr;
      header.text += line + "\n";
    }
  }
  return header;
}

// The numbers standing alone in `text` ("1024", "0.46"; not the 3 of "Qwen3" or "A3B").
std::set<std::string> Numbers(const std::string& text) {
  static const std::regex kNumber(R"(\b\d+(\.\d+)?\b)");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kNumber);
       it != std::sregex_iterator(); ++it) {
    out.insert(it->str());
  }
  return out;
}

class PresetFileTest : public ::testing::TestWithParam<PresetFile> {};

TEST_P(PresetFileTest, SetsItsPresetAndQuotesWhatMoeTrainPrints) {
  const PresetFile& file = GetParam();
  const gflags::FlagSaver saver;
  std::vector<std::string> args = {"moe_train"};
  for (const std::string& name : file.flagfiles) {
    args.push_back("--flagfile=" + (kConfigs / name).string());
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  const StatusOr<HelpRequest> parsed = ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  StatusOr<RunConfig> run = ValidateFlags(/*world_size=*/1);
  ASSERT_TRUE(run.ok()) << run.status().message();

  const GptConfig& preset = ModelPresetNamed(file.preset);
  EXPECT_EQ(ModelShapeJson(run->model), ModelShapeJson(preset));
  EXPECT_TRUE(run->model == preset) << "a field beside the shape differs from the preset's";

  const Header header = ReadHeader(kConfigs / file.flagfiles.back());
  const std::map<std::string, std::string> printed = {{"model", ModelSummary(run->model)},
                                                      {"parameters", ParameterCounts(run->model)},
                                                      {"batch", BatchSummary(*run)}};
  std::set<std::string> quoted;
  for (const auto& [name, quote] : header.quotes) {
    quoted.insert(name);
    EXPECT_EQ(quote, printed.at(name)) << "# " << name << ": in " << file.flagfiles.back();
  }
  EXPECT_EQ(quoted, file.quotes);

  // The header's other figures: values that the run's flags set, or figures it quotes.
  std::set<std::string> allowed;
  for (const std::string& name : file.flagfiles) {
    for (const std::string& line : Lines(kConfigs / name)) {
      if (line.rfind("--", 0) == 0) allowed.merge(Numbers(line));
    }
  }
  for (const auto& [name, quote] : header.quotes) allowed.merge(Numbers(quote));
  static const std::regex kFlag(R"(--\S+)");  // a flag named in the text, with its value
  for (const std::string& number : Numbers(std::regex_replace(header.text, kFlag, ""))) {
    EXPECT_TRUE(allowed.count(number)) << number << " in the header of " << file.flagfiles.back()
                                       << " is neither a flag value nor a quoted figure:\n"
                                       << header.text;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, PresetFileTest, ::testing::ValuesIn(PresetFiles()));

// Every flagfile under configs/ is checked above.
TEST(PresetFilesTest, EveryFlagfileIsChecked) {
  std::set<std::string> on_disk, checked;
  for (const auto& entry : fs::directory_iterator(kConfigs)) {
    if (entry.path().extension() == ".flags") on_disk.insert(entry.path().filename().string());
  }
  for (const PresetFile& file : PresetFiles()) checked.insert(file.flagfiles.back());
  EXPECT_EQ(on_disk, checked);
}

}  // namespace
}  // namespace moe
