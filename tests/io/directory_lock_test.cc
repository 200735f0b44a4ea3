// DirectoryLock: one holder at a time, named to whoever is refused; released when the holder
// lets go or its process dies in any way, so a killed run leaves no stale lock.
#include "engine/io/directory_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/check.h"
#include "tests/testing/command.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Refusal(const std::string& dir, pid_t holder) {
  return dir + " is in use by process " + std::to_string(holder) + " on host " + HostName() +
         " (its lock file " + dir + "/.lock)";
}

TEST(DirectoryLockTest, TheHolderIsNamedToASecondComer) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.Path("ckpt/nested");  // created by Acquire
  StatusOr<std::unique_ptr<DirectoryLock>> first = DirectoryLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE((*first)->held());
  EXPECT_EQ(ReadFile(dir + "/.lock"), std::to_string(getpid()) + " " + HostName() + "\n");

  // Another open file of the same lock, even in this process, is refused.
  StatusOr<std::unique_ptr<DirectoryLock>> second = DirectoryLock::Acquire(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), Refusal(dir, getpid()));

  first->reset();  // let go: the next one holds it
  StatusOr<std::unique_ptr<DirectoryLock>> third = DirectoryLock::Acquire(dir);
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_TRUE((*third)->held());
}

// A holder killed with SIGKILL (no exit-time code runs) leaves the file but not the lock.
TEST(DirectoryLockTest, AKilledHolderLeavesNoStaleLock) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.Path("ckpt");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StatusOr<std::unique_ptr<DirectoryLock>> lock = DirectoryLock::Acquire(dir);
    const char held = lock.ok() ? '1' : '0';
    if (write(ready[1], &held, 1) != 1) _exit(3);
    pause();  // until killed
    _exit(0);
  }
  char held = 0;
  ASSERT_EQ(read(ready[0], &held, 1), 1);
  ASSERT_EQ(held, '1');
  StatusOr<std::unique_ptr<DirectoryLock>> refused = DirectoryLock::Acquire(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), Refusal(dir, child));

  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(fs::exists(dir + "/.lock"));
  StatusOr<std::unique_ptr<DirectoryLock>> after = DirectoryLock::Acquire(dir);
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_TRUE((*after)->held());
  close(ready[0]);
  close(ready[1]);
}

TEST(DirectoryLockTest, ADirectoryThatCannotBeMadeIsAClearError) {
  const testing::ScopedTempDir temp;
  std::ofstream(temp.Path("a_file")) << "x";
  StatusOr<std::unique_ptr<DirectoryLock>> lock = DirectoryLock::Acquire(temp.Path("a_file/sub"));
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().message().rfind("cannot create " + temp.Path("a_file/sub") + ": ", 0), 0u)
      << lock.status().message();
}

}  // namespace
}  // namespace moe
