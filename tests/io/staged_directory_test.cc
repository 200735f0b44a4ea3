// StagedDirectory: the output appears under its name only when published, whole; an existing
// non-empty directory or a file there is refused and left untouched; an empty one is replaced;
// an unpublished output leaves nothing behind.
#include "engine/io/staged_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/testing/command.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using ::moe::testing::ScopedTempDir;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(StagedDirectoryTest, TheOutputAppearsWholeWhenPublished) {
  ScopedTempDir temp;
  const std::string out = temp.Path("nested/out");
  StatusOr<StagedDirectory> staged = StagedDirectory::Create(out);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_TRUE(staged->WriteFile("a.json", "{}\n").ok());
  EXPECT_FALSE(fs::exists(out));
  std::string staging = "nested/.out.tmp-";  // appended: GCC 12 warns (-Wrestrict) on "..." + x
  staging += std::to_string(::getpid());
  EXPECT_EQ(temp.List(), (std::vector<std::string>{"nested", staging, staging + "/a.json"}));
  ASSERT_TRUE(staged->Publish().ok());
  EXPECT_EQ(temp.List(), (std::vector<std::string>{"nested", "nested/out", "nested/out/a.json"}));
  EXPECT_EQ(Read(out + "/a.json"), "{}\n");
}

TEST(StagedDirectoryTest, AnEmptyDirectoryIsReplacedAndAnythingElseRefusedUntouched) {
  ScopedTempDir temp;
  fs::create_directory(temp.Path("empty"));
  StatusOr<StagedDirectory> staged = StagedDirectory::Create(temp.Path("empty"));
  ASSERT_TRUE(staged.ok());
  ASSERT_TRUE(staged->WriteFile("x", "1").ok());
  ASSERT_TRUE(staged->Publish().ok());
  EXPECT_EQ(Read(temp.Path("empty/x")), "1");

  fs::create_directory(temp.Path("full"));
  std::ofstream(temp.Path("full/keep")) << "mine";
  std::ofstream(temp.Path("file")) << "mine";
  for (const char* name : {"full", "file"}) {
    const Status refused = StagedDirectory::Create(temp.Path(name)).status();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.message().find(temp.Path(name) + "' exists and is not"), std::string::npos)
        << refused.message();
    EXPECT_NE(refused.message().find("nothing overwritten"), std::string::npos);
  }
  EXPECT_EQ(Read(temp.Path("full/keep")), "mine");
  EXPECT_EQ(Read(temp.Path("file")), "mine");
}

TEST(StagedDirectoryTest, AnOutputMadeMeanwhileIsNotReplaced) {
  ScopedTempDir temp;
  StatusOr<StagedDirectory> staged = StagedDirectory::Create(temp.Path("out"));
  ASSERT_TRUE(staged.ok());
  fs::create_directory(temp.Path("out"));
  std::ofstream(temp.Path("out/other")) << "theirs";
  EXPECT_FALSE(staged->Publish().ok());
  EXPECT_EQ(Read(temp.Path("out/other")), "theirs");
}

TEST(StagedDirectoryTest, AnUnpublishedOutputLeavesNothing) {
  ScopedTempDir temp;
  {
    StatusOr<StagedDirectory> staged = StagedDirectory::Create(temp.Path("out"));
    ASSERT_TRUE(staged.ok());
    ASSERT_TRUE(staged->WriteFile("half", "written").ok());
  }
  EXPECT_TRUE(temp.List().empty());
}

}  // namespace
}  // namespace moe
