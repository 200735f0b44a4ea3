// SavedTensors (engine/autograd/saved_tensors.h), on its own: Load hands a tensor back once and
// forgets it; a forward-only context keeps nothing; saves belong to the group open at the time
// (in order) and hooks see each commit and each load with its group; Replace swaps in place;
// Drop forgets every key holding one view; the hooks hear of the context's end.
#include "engine/autograd/saved_tensors.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

Tensor Values(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return testing::FromFloats(v, {n}, DType::kF32, Device::CPU());
}

// Records what the context tells its hooks.
struct RecordingHooks final : SavedTensorHooks {
  std::vector<std::string> commits;  // "name@layer: key key ..."
  std::vector<std::string> loads;    // "key in name" or "key outside"
  int destroyed = 0;

  void OnCommit(SavedTensors&, const SavedGroup& group) override {
    std::string line = group.name + "@" + std::to_string(group.layer) + ":";
    for (const std::string& key : group.keys) line += " " + key;
    commits.push_back(line);
  }
  void BeforeLoad(SavedTensors&, const SavedGroup* group, const std::string& key) override {
    loads.push_back(key + (group != nullptr ? " in " + group->name : " outside"));
  }
  void OnDestroy(SavedTensors&) override { ++destroyed; }
};

TEST(SavedTensorsTest, LoadHandsBackOnceAndForgets) {
  SavedTensors saved;
  saved.Save("a", Values({1, 2}));
  saved.Save("b", Values({3}));
  EXPECT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved.keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(testing::ToFloats(saved.Load("a")), (std::vector<float>{1, 2}));
  EXPECT_EQ(saved.size(), 1u);
  EXPECT_EQ(testing::ToFloats(saved.Peek("b")), (std::vector<float>{3}));
  EXPECT_EQ(saved.size(), 1u) << "Peek does not forget";
  saved.Load("b");
  EXPECT_TRUE(saved.empty());
}

TEST(SavedTensorsTest, AForwardOnlyContextKeepsNothing) {
  RecordingHooks hooks;
  {
    SavedTensors saved(/*training=*/false, &hooks);
    const Tensor t = Values({1});
    const size_t group = saved.OpenGroup("g", 0);
    saved.Save("a", t);
    saved.CommitGroup(group);
    EXPECT_EQ(group, 0u);
    EXPECT_TRUE(saved.empty());
    EXPECT_TRUE(saved.groups().empty());
    EXPECT_TRUE(saved.Drop(t).empty());
  }
  EXPECT_TRUE(hooks.commits.empty());
}

TEST(SavedTensorsTest, SavesBelongToTheOpenGroupAndHooksSeeCommitsAndLoads) {
  RecordingHooks hooks;
  {
    SavedTensors saved(true, &hooks);
    saved.Save("before", Values({0}));
    const size_t norm = saved.OpenGroup("norm", 3);
    saved.Save("x", Values({1}));
    saved.Save("rstd", Values({2}));
    saved.CloseGroup(norm);
    saved.Save("outside", Values({3}));
    EXPECT_TRUE(hooks.commits.empty()) << "closed is not committed";
    {
      ScopedSaveGroup attention(saved, "attention", 3);
      saved.Save("q", Values({4}));
    }
    saved.CommitGroup(norm);  // after the residual add, as the norms do
    EXPECT_EQ(hooks.commits, (std::vector<std::string>{"attention@3: q", "norm@3: x rstd"}));
    ASSERT_EQ(saved.groups().size(), 2u);
    EXPECT_TRUE(saved.groups()[0].committed);
    for (const char* key : {"q", "rstd", "x", "outside", "before"}) saved.Load(key);
    EXPECT_EQ(hooks.loads, (std::vector<std::string>{"q in attention", "rstd in norm", "x in norm",
                                                     "outside outside", "before outside"}));
    EXPECT_EQ(hooks.destroyed, 0);
  }
  EXPECT_EQ(hooks.destroyed, 1);
}

TEST(SavedTensorsTest, ReplaceSwapsInPlaceAndDropForgetsEveryKeyOfOneView) {
  SavedTensors saved;
  const Tensor shared = Values({1, 2, 3, 4});
  saved.Save("norm.out", shared);
  saved.Save("attention.x", shared);
  saved.Save("first_half", shared.View({2, 2}));  // another view of the same storage
  saved.Save("other", Values({5}));
  saved.Replace("other", Values({6}));
  EXPECT_EQ(testing::ToFloats(saved.Peek("other")), (std::vector<float>{6}));
  EXPECT_EQ(saved.Drop(shared), (std::vector<std::string>{"attention.x", "norm.out"}));
  EXPECT_EQ(saved.keys(), (std::vector<std::string>{"first_half", "other"}));
}

TEST(SavedTensorsDeathTest, SavingAKeyTwiceIsABug) {
  EXPECT_DEATH(
      {
        SavedTensors saved;
        saved.Save("a", Values({1}));
        saved.Save("a", Values({2}));
      },
      "a");
}

}  // namespace
}  // namespace moe
