// Layer partition: even splits over pipeline_size x virtual_chunks stages in Megatron's stage
// order, first/last stage overrides, and the errors for layouts a user can get wrong.
#include "engine/pipeline/partition.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moe {
namespace {

PartitionOptions Options(int layers, int p, int v = 1, int first = PartitionOptions::kEvenSplit,
                         int last = PartitionOptions::kEvenSplit) {
  PartitionOptions o;
  o.num_layers = layers;
  o.pipeline_size = p;
  o.virtual_chunks = v;
  o.first_stage_layers = first;
  o.last_stage_layers = last;
  return o;
}

std::vector<LayerRange> Stages(const LayerPartition& partition) {
  std::vector<LayerRange> out;
  for (int s = 0; s < partition.num_stages(); ++s) out.push_back(partition.stage_layers(s));
  return out;
}

// The error message of a layout that must fail.
std::string Error(const PartitionOptions& o) {
  StatusOr<LayerPartition> partition = LayerPartition::Create(o);
  EXPECT_FALSE(partition.ok());
  if (partition.ok()) return "";
  EXPECT_EQ(partition.status().code(), StatusCode::kInvalidArgument);
  return partition.status().message();
}

TEST(PartitionTest, SingleStageHoldsEverything) {
  StatusOr<LayerPartition> partition = LayerPartition::Create(Options(3, 1));
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  EXPECT_EQ(Stages(*partition), (std::vector<LayerRange>{{0, 3}}));
  EXPECT_TRUE(partition->is_first_stage(0));
  EXPECT_TRUE(partition->is_last_stage(0));
}

TEST(PartitionTest, EvenSplitInMegatronStageOrder) {
  StatusOr<LayerPartition> partition = LayerPartition::Create(Options(8, 2, 2));
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  EXPECT_EQ(partition->num_stages(), 4);
  EXPECT_EQ(partition->pipeline_size(), 2);
  EXPECT_EQ(partition->virtual_chunks(), 2);
  EXPECT_EQ(Stages(*partition), (std::vector<LayerRange>{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  // Chunk c of rank r is stage c * p + r.
  EXPECT_EQ(partition->layers(0, 0), (LayerRange{0, 2}));
  EXPECT_EQ(partition->layers(1, 0), (LayerRange{2, 4}));
  EXPECT_EQ(partition->layers(0, 1), (LayerRange{4, 6}));
  EXPECT_EQ(partition->layers(1, 1), (LayerRange{6, 8}));
  EXPECT_EQ(StageIndex(1, 1, 2), 3);
  EXPECT_TRUE(partition->is_first_stage(0));
  EXPECT_FALSE(partition->is_first_stage(2));
  EXPECT_TRUE(partition->is_last_stage(3));
  EXPECT_FALSE(partition->is_last_stage(1));
  const std::string text = partition->ToString();
  EXPECT_NE(text.find("stage 0 (rank 0, chunk 0): layers [0, 2) + embedding"), std::string::npos)
      << text;
  EXPECT_NE(text.find("stage 2 (rank 0, chunk 1): layers [4, 6)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 3 (rank 1, chunk 1): layers [6, 8) + head, loss"), std::string::npos)
      << text;
}

TEST(PartitionTest, FirstAndLastStageOverrides) {
  StatusOr<LayerPartition> both = LayerPartition::Create(Options(14, 4, 1, 3, 3));
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(Stages(*both), (std::vector<LayerRange>{{0, 3}, {3, 7}, {7, 11}, {11, 14}}));

  StatusOr<LayerPartition> first = LayerPartition::Create(Options(7, 4, 1, 1));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(Stages(*first), (std::vector<LayerRange>{{0, 1}, {1, 3}, {3, 5}, {5, 7}}));

  StatusOr<LayerPartition> last =
      LayerPartition::Create(Options(9, 2, 2, PartitionOptions::kEvenSplit, 0));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(Stages(*last), (std::vector<LayerRange>{{0, 3}, {3, 6}, {6, 9}, {9, 9}}));
  EXPECT_EQ(last->layers(1, 1).size(), 0);  // the head and loss only

  StatusOr<LayerPartition> two = LayerPartition::Create(Options(5, 2, 1, 2, 3));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(Stages(*two), (std::vector<LayerRange>{{0, 2}, {2, 5}}));
}

TEST(PartitionTest, MoreStagesThanLayers) {
  const std::string error = Error(Options(2, 4));
  EXPECT_NE(error.find("--num_layers=2"), std::string::npos) << error;
  EXPECT_NE(error.find("--pipeline_parallel=4"), std::string::npos) << error;
  EXPECT_NE(Error(Options(6, 2, 4)).find("--virtual_pipeline=4"), std::string::npos);
}

TEST(PartitionTest, UnevenSplitWithoutOverrides) {
  const std::string error = Error(Options(10, 4));
  EXPECT_NE(error.find("does not split evenly"), std::string::npos) << error;
  EXPECT_NE(error.find("--first_stage_layers"), std::string::npos) << error;
  EXPECT_NE(Error(Options(8, 2, 3)).find("--virtual_pipeline=3"), std::string::npos);
}

TEST(PartitionTest, BadOverrides) {
  EXPECT_NE(Error(Options(8, 4, 1, -2)).find("--first_stage_layers=-2"), std::string::npos);
  EXPECT_NE(Error(Options(8, 4, 1, PartitionOptions::kEvenSplit, 9)).find("--last_stage_layers=9"),
            std::string::npos);
  EXPECT_NE(Error(Options(8, 4, 1, 5, 5)).find("exceed --num_layers=8"), std::string::npos);
  EXPECT_NE(Error(Options(8, 1, 1, 2)).find("at least 2 pipeline stages"), std::string::npos);
  EXPECT_NE(Error(Options(8, 2, 1, 2, 3)).find("must add up to --num_layers=8"), std::string::npos);
  // 14 - 2 - 3 = 9 layers over 2 middle stages.
  const std::string uneven = Error(Options(14, 4, 1, 2, 3));
  EXPECT_NE(uneven.find("remaining 9"), std::string::npos) << uneven;
  // Nothing left for the middle stages.
  EXPECT_NE(Error(Options(8, 4, 1, 4, 4)).find("at least one each"), std::string::npos);
}

TEST(PartitionTest, BadSizes) {
  EXPECT_NE(Error(Options(0, 1)).find("--num_layers=0"), std::string::npos);
  EXPECT_NE(Error(Options(4, 0)).find("--pipeline_parallel=0"), std::string::npos);
  EXPECT_NE(Error(Options(4, 1, 0)).find("--virtual_pipeline=0"), std::string::npos);
}

}  // namespace
}  // namespace moe
