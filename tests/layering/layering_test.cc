// The source tree's layering, read from its #include lines (MOE_SOURCE_DIR): the engine's
// folders include one another without a cycle (each folder only below itself), the engine knows
// nothing of modules/ or apps/, modules/ includes no CUDA or Eigen header, and of apps/ a program
// (moe_train, each benchmark) includes only its own folder and apps/common, which includes no
// program's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace moe {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = MOE_SOURCE_DIR;

// Every quoted or angled include of the sources under `dir`, by file.
std::map<std::string, std::vector<std::string>> Includes(const fs::path& dir) {
  static const std::regex kInclude(R"(^\s*#\s*include\s*["<]([^">]+)[">])");
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh" && ext != ".inc") continue;
    std::ifstream file(entry.path());
    std::string line;
    std::smatch match;
    auto& includes = out[fs::relative(entry.path(), kRoot).string()];
    while (std::getline(file, line)) {
      if (std::regex_search(line, match, kInclude)) includes.push_back(match[1]);
    }
  }
  return out;
}

// "engine/<folder>/..." -> folder.
std::string EngineFolder(const std::string& path) {
  const size_t begin = path.find('/') + 1;
  return path.substr(begin, path.find('/', begin) - begin);
}

TEST(LayeringTest, EngineFoldersIncludeEachOtherWithoutACycle) {
  std::map<std::string, std::set<std::string>> edges;  // folder -> folders it includes
  for (const auto& [file, includes] : Includes(kRoot / "engine")) {
    const std::string from = EngineFolder(file);
    for (const std::string& include : includes) {
      EXPECT_NE(include.rfind("modules/", 0), 0u) << file << " includes " << include;
      EXPECT_NE(include.rfind("apps/", 0), 0u) << file << " includes " << include;
      if (include.rfind("engine/", 0) != 0) continue;
      const std::string to = EngineFolder(include);
      if (to != from) edges[from].insert(to);
    }
  }
  ASSERT_GE(edges.size(), 5u) << "the engine's folders were not found under " << kRoot;
  // Depth-first search for a back edge; the path of a cycle is the message.
  std::map<std::string, int> state;  // 0 new, 1 on the path, 2 done
  std::vector<std::string> path;
  std::function<void(const std::string&)> visit = [&](const std::string& folder) {
    state[folder] = 1;
    path.push_back(folder);
    for (const std::string& next : edges[folder]) {
      if (state[next] == 1) {
        std::string cycle;
        for (const std::string& f : path) cycle += f + " -> ";
        ADD_FAILURE() << "include cycle: " << cycle << next;
      } else if (state[next] == 0) {
        visit(next);
      }
    }
    path.pop_back();
    state[folder] = 2;
  };
  for (const auto& [folder, targets] : edges) {
    if (state[folder] == 0) visit(folder);
  }
}

TEST(LayeringTest, ModulesIncludeNoCudaOrEigenHeader) {
  const std::regex kForbidden(
      R"(^(cuda|cublas|cudnn|nccl|curand|cub/|thrust/|Eigen/|unsupported/Eigen))");
  int files = 0;
  for (const auto& [file, includes] : Includes(kRoot / "modules")) {
    ++files;
    for (const std::string& include : includes) {
      EXPECT_FALSE(std::regex_search(include, kForbidden)) << file << " includes " << include;
    }
  }
  EXPECT_GT(files, 10);
}

// "apps/<folder>/..." -> folder; "" for a path outside apps/.
std::string AppsFolder(const std::string& path) {
  if (path.rfind("apps/", 0) != 0) return "";
  return path.substr(5, path.find('/', 5) - 5);
}

TEST(LayeringTest, ProgramsIncludeOnlyTheirOwnFolderAndAppsCommon) {
  std::set<std::string> folders;
  for (const auto& [file, includes] : Includes(kRoot / "apps")) {
    const std::string from = AppsFolder(file);
    folders.insert(from);
    for (const std::string& include : includes) {
      const std::string to = AppsFolder(include);
      if (to.empty() || to == from) continue;
      EXPECT_EQ(to, "common") << file << " includes " << include;
    }
  }
  for (const char* folder :
       {"common", "moe_train", "moe_bench", "attention_bench", "optimizer_bench"}) {
    EXPECT_TRUE(folders.count(folder)) << "apps/" << folder << " was not found under " << kRoot;
  }
}

}  // namespace
}  // namespace moe
