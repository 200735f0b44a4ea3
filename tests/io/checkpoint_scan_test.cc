// What a checkpoint root holds: which step directories are complete (every file whole), which
// one a resume takes (the newest complete, with a note when it is not the one `latest` names),
// and the temporaries of interrupted saves, removed by name.
#include "engine/io/checkpoint_scan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "engine/io/checkpoint.h"
#include "engine/kernels/ops.h"
#include "tests/testing/command.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

class CheckpointScanTest : public ::testing::Test {
 protected:
  // Saves a small checkpoint of `step` into root_.
  void Save(int64_t step) {
    Tensor weight = Tensor::Empty({4, 8}, DType::kF32, Device::CPU());
    const std::vector<float> values(32, 0.5f);
    ops::CopyFromHost(values.data(), weight);
    ASSERT_TRUE(
        SaveCheckpoint(root_, step, {{"w", weight}}, {{"w.exp_avg", weight}}, {{"step", step}})
            .ok());
  }
  std::string Step(int64_t step) const { return root_ + "/" + CheckpointStepDirName(step); }
  void WriteLatest(const std::string& content) const {
    std::ofstream(root_ + "/latest") << content;
  }

  const testing::ScopedTempDir temp_;
  const std::string root_ = temp_.Path("ckpt");
};

TEST_F(CheckpointScanTest, ASavedStepDirectoryIsCompleteAndADamagedOneSaysWhy) {
  Save(100);
  EXPECT_TRUE(ReadStepDirectory(Step(100)).ok());

  const std::string model = Step(100) + "/model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 1);
  Status status = ReadStepDirectory(Step(100)).status();
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(status.message().rfind("'" + model + "': tensor ", 0), 0u) << status.message();

  Save(200);
  std::ofstream(Step(200) + "/optimizer.safetensors", std::ios::app) << "more";  // grown
  EXPECT_FALSE(ReadStepDirectory(Step(200)).ok());

  Save(300);
  std::ofstream(Step(300) + "/state.json") << R"({"step": 3)";  // cut short
  EXPECT_FALSE(ReadStepDirectory(Step(300)).ok());

  Save(400);
  fs::remove(Step(400) + "/state.json");
  EXPECT_EQ(ReadStepDirectory(Step(400)).status().message(),
            "cannot read '" + Step(400) + "/state.json'");
}

TEST_F(CheckpointScanTest, WithoutLatestTheNewestCompleteStepIsTaken) {
  Save(100);
  Save(200);
  fs::remove(root_ + "/latest");
  StatusOr<ResumeChoice> choice = ChooseResumeDir(root_);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_EQ(choice->dir, Step(200));
  EXPECT_EQ(choice->note, root_ +
                              ": resuming from step_00000200, its newest complete step directory: "
                              "it has no 'latest'");
  // The engine's resolution is the same one: a load takes it too.
  EXPECT_EQ(ResolveCheckpointDir(root_).value(), Step(200));
  EXPECT_EQ(ReadCheckpointState(root_)->note, choice->note);
}

TEST_F(CheckpointScanTest, WhatLatestNamesIsTakenWhenItIsTheNewestComplete) {
  Save(100);
  Save(200);
  StatusOr<ResumeChoice> choice = ChooseResumeDir(root_);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_EQ(choice->dir, Step(200));
  EXPECT_EQ(choice->note, "");
}

// A save that published its directory but was stopped before it updated `latest`.
TEST_F(CheckpointScanTest, ANewerCompleteStepThanLatestIsTaken) {
  Save(100);
  Save(200);
  WriteLatest("step_00000100\n");
  StatusOr<ResumeChoice> choice = ChooseResumeDir(root_);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_EQ(choice->dir, Step(200));
  EXPECT_EQ(choice->note, root_ +
                              ": resuming from step_00000200, its newest complete step directory: "
                              "'latest' names step_00000100, older than the complete "
                              "step_00000200 (a save stopped before it updated 'latest')");
}

TEST_F(CheckpointScanTest, AnIncompleteNewestStepIsPassedOverWithWhy) {
  Save(100);
  Save(200);
  const std::string model = Step(200) + "/model.safetensors";
  fs::resize_file(model, 10);
  StatusOr<ResumeChoice> choice = ChooseResumeDir(root_);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_EQ(choice->dir, Step(100));
  EXPECT_EQ(choice->note.rfind(root_ +
                                   ": resuming from step_00000100, its newest complete step "
                                   "directory: 'latest' names step_00000200, which is incomplete "
                                   "('" +
                                   model + "': ",
                               0),
            0u)
      << choice->note;

  // Not named by `latest`: listed after the reason.
  Save(300);
  fs::remove(Step(300) + "/state.json");
  WriteLatest("step_00000100\n");
  choice = ChooseResumeDir(root_);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_EQ(choice->dir, Step(100));
  EXPECT_EQ(choice->note, root_ +
                              ": resuming from step_00000100 ('latest'); step_00000300 is "
                              "incomplete (cannot read '" +
                              Step(300) + "/state.json'); step_00000200 is incomplete (" +
                              ReadStepDirectory(Step(200)).status().message() + ")");
}

TEST_F(CheckpointScanTest, NothingCompleteIsAnErrorNamingWhy) {
  fs::create_directories(root_);
  EXPECT_EQ(ChooseResumeDir(root_).status().message(),
            "'" + root_ +
                "' is neither a checkpoint root (no step directory) nor a step directory (no "
                "'state.json')");
  fs::create_directories(Step(7));
  EXPECT_EQ(ChooseResumeDir(root_).status().message(),
            "checkpoint root '" + root_ +
                "' holds no complete step directory (step_00000007 is "
                "incomplete (cannot read '" +
                Step(7) + "/state.json'))");
  WriteLatest("step_00000007\n");  // its own error, as a load of it would say
  EXPECT_EQ(ChooseResumeDir(root_).status().message(), "cannot read '" + Step(7) + "/state.json'");
  WriteLatest("../elsewhere\n");
  EXPECT_EQ(ChooseResumeDir(root_).status().message(),
            "checkpoint root '" + root_ + "': 'latest' does not hold a directory name");
}

TEST_F(CheckpointScanTest, StepDirectoriesAreOrderedByTheirStep) {
  fs::create_directories(root_ + "/step_99999999");
  fs::create_directories(root_ + "/step_100000000");  // past 8 digits
  fs::create_directories(root_ + "/step_00000005");
  std::ofstream(root_ + "/step_00000009") << "a file, not a directory";
  EXPECT_EQ(ListCheckpointRoot(root_).step_dirs,
            (std::vector<std::string>{"step_100000000", "step_99999999", "step_00000005"}));
}

TEST_F(CheckpointScanTest, TheTemporariesOfInterruptedSavesAreRemovedByName) {
  Save(100);
  fs::create_directories(root_ + "/.step_00000200.tmp-4242");
  std::ofstream(root_ + "/.step_00000200.tmp-4242/model.safetensors") << "half";
  std::ofstream(root_ + "/latest.tmp") << "step_00000200\n";
  std::ofstream(root_ + "/notes.txt") << "the user's";
  fs::create_directories(root_ + "/.step_x.tmp-1");  // not names Save writes
  fs::create_directories(root_ + "/.step_00000200.tmp-old");
  EXPECT_EQ(ListCheckpointRoot(root_).temporaries,
            (std::vector<std::string>{".step_00000200.tmp-4242", "latest.tmp"}));
  StatusOr<std::vector<std::string>> removed = RemoveCheckpointTemporaries(root_);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, (std::vector<std::string>{".step_00000200.tmp-4242", "latest.tmp"}));
  EXPECT_FALSE(fs::exists(root_ + "/.step_00000200.tmp-4242"));
  EXPECT_FALSE(fs::exists(root_ + "/latest.tmp"));
  EXPECT_TRUE(fs::exists(root_ + "/notes.txt"));
  EXPECT_TRUE(fs::exists(root_ + "/.step_x.tmp-1"));
  EXPECT_TRUE(fs::exists(root_ + "/.step_00000200.tmp-old"));
  EXPECT_TRUE(ReadStepDirectory(Step(100)).ok());
  EXPECT_TRUE(RemoveCheckpointTemporaries(root_)->empty());
}

}  // namespace
}  // namespace moe
