// Bucket layout (parameter_buckets.h) and a bucketed ParameterSet: buckets coalesce consecutive
// parameters in reverse creation order up to the target, parameters and shards start aligned,
// a bucket splits into equal shards, and never splits a stack, whose members lie back to back;
// a stack is one matrix of its members as they would be created alone; a bucketed set starts
// from the plain set's values, its parameters' tensors are views of the bucket buffers, and the
// shards' owned slices cover every element of every parameter exactly once, a stack's in one slice
// per shard. Buckets never mix replica groups, and each is sharded over its own group's ranks.
#include "engine/autograd/parameter_buckets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "engine/autograd/parameters.h"
#include "tests/testing/owned_slices.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

// n parameters of the data group.
std::vector<ReplicaGroup> Dense(size_t n) {
  return std::vector<ReplicaGroup>(n, ReplicaGroup::kData);
}

// The data group's buckets in `shards`, this rank owning `shard`.
BucketSharding DataShards(int shards, int shard = 0) { return {.data = {shards, shard}}; }

TEST(PlanBucketsTest, CoalescesInReverseCreationOrderUpToTheTarget) {
  // f32 bytes: 400, 40, 4000, 40, 40, 400; target 480 bytes.
  const std::vector<int64_t> numels = {100, 10, 1000, 10, 10, 100};
  const std::array<bool, 6> alone{};
  const std::vector<BucketLayout> buckets =
      PlanBuckets(numels, alone, Dense(6), DataShards(1), 480);
  ASSERT_EQ(buckets.size(), 3u);
  // Backward order: {3, 4, 5} (480 bytes), {2} alone, {0, 1}.
  EXPECT_EQ(buckets[0].begin, 3u);
  EXPECT_EQ(buckets[0].end, 6u);
  EXPECT_EQ(buckets[1].begin, 2u);
  EXPECT_EQ(buckets[1].end, 3u);
  EXPECT_EQ(buckets[2].begin, 0u);
  EXPECT_EQ(buckets[2].end, 2u);
  EXPECT_EQ(buckets[0].offsets, (std::vector<int64_t>{0, 128, 256}));
  EXPECT_EQ(buckets[0].numel, 384);
  EXPECT_EQ(buckets[1].numel, 1024);
}

TEST(PlanBucketsTest, PadsToEqualAlignedShards) {
  const std::vector<int64_t> numels = {300, 5};
  const std::array<bool, 2> alone{};
  for (int shards : {1, 2, 3, 8}) {
    const std::vector<BucketLayout> buckets =
        PlanBuckets(numels, alone, Dense(2), DataShards(shards), int64_t{1} << 20);
    ASSERT_EQ(buckets.size(), 1u);
    const BucketLayout& b = buckets[0];
    EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 384}));
    EXPECT_EQ(b.numel % (shards * kBucketAlignment), 0) << shards;
    EXPECT_GE(b.numel, 384 + 5);
    EXPECT_EQ(b.shard_numel() * shards, b.numel);
    EXPECT_EQ(b.shard_begin(shards - 1), (shards - 1) * b.shard_numel());
  }
}

TEST(PlanBucketsTest, NeverMixesReplicaGroupsAndPadsForEachGroupsShards) {
  const std::vector<int64_t> numels = {100, 10, 10, 10, 100};
  const std::array<bool, 5> alone{};
  using enum ReplicaGroup;
  const std::vector<ReplicaGroup> replicas = {kData, kExpertData, kExpertData, kData, kData};
  // The target would take every parameter: the groups alone split them.
  const std::vector<BucketLayout> buckets =
      PlanBuckets(numels, alone, replicas, {.data = {2, 0}, .expert_data = {3, 0}}, 1 << 20);
  ASSERT_EQ(buckets.size(), 3u);  // {3, 4}, {1, 2}, {0}
  const std::vector<std::array<size_t, 2>> ranges = {{3, 5}, {1, 3}, {0, 1}};
  const std::vector<ReplicaGroup> groups = {kData, kExpertData, kData};
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_EQ(buckets[b].begin, ranges[b][0]) << b;
    EXPECT_EQ(buckets[b].end, ranges[b][1]) << b;
    EXPECT_EQ(buckets[b].replicas, groups[b]) << b;
    EXPECT_EQ(buckets[b].shards, groups[b] == kData ? 2 : 3) << b;
    EXPECT_EQ(buckets[b].numel % (buckets[b].shards * kBucketAlignment), 0) << b;
  }
}

TEST(PlanBucketsDeathTest, AStackIsOfOneReplicaGroup) {
  const std::vector<int64_t> numels = {10, 10};
  const std::array<bool, 2> joins = {false, true};
  const std::vector<ReplicaGroup> replicas = {ReplicaGroup::kData, ReplicaGroup::kExpertData};
  EXPECT_DEATH(PlanBuckets(numels, joins, replicas, {}, 1 << 20), "another replica group");
}

// Parameter 0, a stack of 1..3 (400 + 200 + 200 elements), parameter 4.
const std::vector<int64_t> kStackNumels = {100, 400, 200, 200, 10};
const std::array<bool, 5> kStackJoins = {false, false, true, true, false};

TEST(PlanBucketsTest, AStackLiesBackToBackInOneBucketEvenBeyondTheTarget) {
  // Target 1000 bytes: without the stack, {3, 4} (840 bytes) would form the first bucket.
  const std::vector<BucketLayout> buckets =
      PlanBuckets(kStackNumels, kStackJoins, Dense(5), DataShards(1), 1000);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].begin, 4u);
  EXPECT_EQ(buckets[0].end, 5u);
  EXPECT_EQ(buckets[1].begin, 1u);  // the stack alone, 3200 bytes
  EXPECT_EQ(buckets[1].end, 4u);
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 400, 600}));
  EXPECT_EQ(buckets[1].numel, 896);  // 800 padded
  EXPECT_EQ(buckets[2].begin, 0u);
  EXPECT_EQ(buckets[2].end, 1u);
}

TEST(PlanBucketsTest, AStackStartsAlignedAndThePaddingFollowsIt) {
  for (int shards : {1, 2, 3, 8}) {
    const std::vector<BucketLayout> buckets =
        PlanBuckets(kStackNumels, kStackJoins, Dense(5), DataShards(shards), int64_t{1} << 20);
    ASSERT_EQ(buckets.size(), 1u);
    const BucketLayout& b = buckets[0];
    // The stack at 128 (aligned), its members contiguous; parameter 4 at 928 rounded up.
    EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 128, 528, 728, 1024}));
    EXPECT_EQ(b.numel % (shards * kBucketAlignment), 0) << shards;
    EXPECT_GE(b.numel, 1024 + 10);
    EXPECT_EQ(b.shard_numel() * shards, b.numel);
  }
}

TEST(PlanBucketsTest, IntersectParameterClampsToTheParameter) {
  // A parameter of 100 elements at bucket offset 50.
  EXPECT_EQ(IntersectParameter(50, 100, 0, 64).first, 0);
  EXPECT_EQ(IntersectParameter(50, 100, 0, 64).last, 14);
  EXPECT_EQ(IntersectParameter(50, 100, 64, 128).first, 14);
  EXPECT_EQ(IntersectParameter(50, 100, 64, 128).last, 78);
  EXPECT_EQ(IntersectParameter(50, 100, 128, 256).first, 78);
  EXPECT_EQ(IntersectParameter(50, 100, 128, 256).last, 100);
  EXPECT_TRUE(IntersectParameter(50, 100, 0, 50).empty());
  EXPECT_TRUE(IntersectParameter(50, 100, 150, 300).empty());
}

std::vector<ParameterSpec> Specs() {
  return {{"a.weight", {7, 5}},
          {"a.norm", {5}, Init::kOnes, 0.02f, /*weight_decay=*/false},
          {"b.weight", {3, 50}},
          {"c.weight", {130}}};
}

TEST(BucketedParameterSetTest, StartsFromThePlainSetsValuesAsViewsOfTheBuckets) {
  ParameterSet plain(Device::CPU(), DType::kF32, /*seed=*/5);
  ParameterSet bucketed = ParameterSet::Deferred(Device::CPU(), DType::kF32, /*seed=*/5);
  for (const ParameterSpec& spec : Specs()) {
    plain.Create(spec);
    bucketed.Create(spec);
  }
  bucketed.AllocateBuckets(DataShards(1), /*bucket_bytes=*/200 * 4);
  ASSERT_EQ(bucketed.buckets().size(), 2u);  // {c}, {a.weight, a.norm, b}
  for (size_t i = 0; i < plain.all().size(); ++i) {
    const Parameter& want = *plain.all()[i];
    const Parameter& got = *bucketed.all()[i];
    EXPECT_EQ(got.value.shape(), want.value.shape()) << want.name;
    EXPECT_TRUE(got.value.is_parameter());
    EXPECT_EQ(testing::ToFloats(got.value), testing::ToFloats(want.value)) << want.name;
    EXPECT_EQ(testing::ToFloats(got.exp_avg), std::vector<float>(want.value.numel(), 0.0f));
    EXPECT_TRUE(got.master.SharesStorageWith(got.value));
    const ParameterBucket& bucket = bucketed.buckets()[i < 3 ? 1 : 0];
    EXPECT_TRUE(got.grad.SharesStorageWith(bucket.grad)) << want.name;
    EXPECT_TRUE(got.exp_avg_sq.SharesStorageWith(bucket.exp_avg_sq)) << want.name;
  }
  EXPECT_EQ(bucketed.OwnedSlices().size(), plain.all().size());
}

// Around a stack, the query, key and value projections of a small attention: its members as
// they would be created alone, in creation order (the stack is specs 2, 3 and 4). The key starts
// 287 elements into the stack, not 16-byte aligned.
std::vector<ParameterSpec> SpecsAroundAStack() {
  return {{"embed", {7, 5}},   {"attn.norm", {7}, Init::kOnes, 0.02f, /*weight_decay=*/false},
          {"attn.q", {41, 7}}, {"attn.k", {20, 7}},
          {"attn.v", {20, 7}}, {"attn.proj", {3, 50}}};
}

ParameterStack& CreateAroundAStack(ParameterSet& set) {
  const std::vector<ParameterSpec> specs = SpecsAroundAStack();
  set.Create(specs[0]);
  set.Create(specs[1]);
  ParameterStack& stack = set.CreateStack(std::span(specs).subspan(2, 3));
  set.Create(specs[5]);
  return stack;
}

ParameterSet CreatedAlone() {
  ParameterSet alone(Device::CPU(), DType::kF32, /*seed=*/5);
  for (const ParameterSpec& spec : SpecsAroundAStack()) alone.Create(spec);
  return alone;
}

TEST(ParameterStackTest, IsOneMatrixOfItsMembersAsTheyWouldBeCreatedAlone) {
  const ParameterSet alone = CreatedAlone();
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/5);
  const ParameterStack& stack = CreateAroundAStack(set);
  ASSERT_EQ(stack.members.size(), 3u);
  EXPECT_EQ(stack.value.shape(), (Shape{81, 7}));
  EXPECT_EQ(stack.grad.shape(), (Shape{81, 7}));
  EXPECT_TRUE(stack.value.is_parameter());
  int64_t row = 0;
  for (size_t i = 0; i < stack.members.size(); ++i) {
    const Parameter& p = *stack.members[i];
    EXPECT_EQ(&p, set.all()[2 + i].get());
    const Parameter& want = *alone.all()[2 + i];
    EXPECT_EQ(p.name, want.name);
    EXPECT_EQ(p.value.shape(), want.value.shape()) << p.name;
    EXPECT_TRUE(p.value.is_parameter()) << p.name;
    EXPECT_EQ(testing::ToFloats(p.value), testing::ToFloats(want.value)) << p.name;
    const int64_t rows = p.value.dim(0);
    EXPECT_EQ(p.value.data(), stack.value.Rows(row, row + rows).data()) << p.name;
    EXPECT_EQ(p.grad.data(), stack.grad.Rows(row, row + rows).data()) << p.name;
    row += rows;
  }
  // The optimizer updates the stack as one slice over its members' state, laid out alike.
  const std::vector<OwnedSlice> slices = set.OwnedSlices();
  ASSERT_EQ(slices.size(), 4u);  // embed, attn.norm, the stack, attn.proj
  for (size_t i : {0, 1, 3}) EXPECT_EQ(slices[i].parameters, 1);
  const OwnedSlice& s = slices[2];
  EXPECT_EQ(s.value.data(), stack.value.data());
  EXPECT_EQ(s.grad.data(), stack.grad.data());
  EXPECT_EQ(testing::ToFloats(s.exp_avg), std::vector<float>(81 * 7, 0.0f));
  const std::vector<testing::SlicePart> parts = testing::SliceParts(set, s);
  ASSERT_EQ(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    const Parameter& p = *stack.members[i];
    EXPECT_EQ(parts[i].parameter, &p);
    EXPECT_EQ(parts[i].first, 0);
    EXPECT_EQ(parts[i].count, p.value.numel());
    const int64_t at = parts[i].at * static_cast<int64_t>(sizeof(float));
    EXPECT_EQ(p.exp_avg.data(), static_cast<const char*>(s.exp_avg.data()) + at) << p.name;
    EXPECT_EQ(p.exp_avg_sq.data(), static_cast<const char*>(s.exp_avg_sq.data()) + at) << p.name;
  }
}

TEST(ParameterStackTest, BeginGradWriteStartsEveryMembersWrite) {
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/5);
  ParameterStack& stack = CreateAroundAStack(set);
  EXPECT_FALSE(BeginGradWrite(stack));  // pending zero: store
  for (const Parameter* p : stack.members) EXPECT_FALSE(p->grad_pending_zero) << p->name;
  EXPECT_TRUE(BeginGradWrite(stack));
  set.ZeroGrads();
  EXPECT_FALSE(BeginGradWrite(stack));
}

TEST(ParameterStackDeathTest, MembersDisagreeingOnAPendingZeroAreABug) {
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/5);
  ParameterStack& stack = CreateAroundAStack(set);
  BeginGradWrite(*stack.members[1]);
  EXPECT_DEATH(BeginGradWrite(stack), "pending zero");
}

TEST(ParameterStackTest, ASpecsOnlySetRecordsTheMembers) {
  ParameterSet set = ParameterSet::SpecsOnly();
  const ParameterStack& stack = CreateAroundAStack(set);
  EXPECT_FALSE(stack.value.defined());
  EXPECT_FALSE(stack.grad.defined());
  ASSERT_EQ(stack.members.size(), 3u);
  EXPECT_EQ(stack.members[1]->name, "attn.k");
  ASSERT_EQ(set.specs().size(), SpecsAroundAStack().size());
  for (size_t i = 0; i < set.specs().size(); ++i) {
    EXPECT_EQ(set.specs()[i].name, SpecsAroundAStack()[i].name);
    EXPECT_EQ(set.specs()[i].shape, SpecsAroundAStack()[i].shape);
  }
}

// Element (parameter, index) -> how many shards own it, for one shard and for three.
TEST(BucketedParameterSetTest, ShardsOwnEveryElementOnceAStackInOneSlice) {
  ParameterSet alone = CreatedAlone();
  // (shards, shard) -> the `parameters` of the slices holding stack members: the whole stack in
  // one slice; in three shards of 384 elements, q's first 256 elements in shard 0's and the rest
  // of q, k and v in shard 1's.
  const std::map<std::pair<int, int>, std::vector<int>> stack_slices = {
      {{1, 0}, {3}}, {{3, 0}, {1}}, {{3, 1}, {3}}, {{3, 2}, {}}};
  for (int shards : {1, 3}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    std::map<std::string, std::vector<int>> owners;
    for (const auto& p : alone.all()) owners[p->name].assign(p->value.numel(), 0);
    for (int shard = 0; shard < shards; ++shard) {
      ParameterSet set = ParameterSet::Deferred(Device::CPU(), DType::kF32, /*seed=*/5);
      const ParameterStack& stack = CreateAroundAStack(set);
      set.AllocateBuckets(DataShards(shards, shard), /*bucket_bytes=*/750 * 4);
      EXPECT_EQ(set.shards(ReplicaGroup::kData), shards);
      // {attn.norm, the stack, attn.proj} (2896 bytes), {embed}.
      ASSERT_EQ(set.buckets().size(), 2u);
      const ParameterBucket& bucket = set.buckets()[0];
      EXPECT_EQ(bucket.layout.offsets, (std::vector<int64_t>{0, 128, 415, 555, 768}));
      EXPECT_EQ(stack.value.shape(), (Shape{81, 7}));
      EXPECT_TRUE(stack.value.is_parameter());
      EXPECT_EQ(stack.value.data(), stack.members[0]->value.data());
      EXPECT_EQ(stack.grad.data(), stack.members[0]->grad.data());
      EXPECT_TRUE(stack.grad.SharesStorageWith(bucket.grad));
      for (const auto& p : set.all()) EXPECT_EQ(p->exp_avg.defined(), shards == 1) << p->name;
      const auto in_stack = [&](const Parameter* p) {
        return std::find(stack.members.begin(), stack.members.end(), p) != stack.members.end();
      };
      std::vector<int> got_stack_slices;
      for (const OwnedSlice& s : set.OwnedSlices()) {
        if (in_stack(s.parameter)) got_stack_slices.push_back(s.parameters);
        EXPECT_EQ(s.master.numel(), s.value.numel());
        EXPECT_EQ(s.exp_avg.numel(), s.value.numel());
        // The CPU master is the value itself, and starts from the values created alone.
        EXPECT_EQ(s.master.data(), s.value.data());
        const std::vector<float> got = testing::ToFloats(s.master);
        const std::vector<testing::SlicePart> parts = testing::SliceParts(set, s);
        for (const testing::SlicePart& part : parts) {
          const Parameter& p = *part.parameter;
          EXPECT_EQ(in_stack(&p), in_stack(s.parameter)) << p.name;
          EXPECT_EQ(static_cast<const float*>(s.grad.data()) + part.at,
                    static_cast<const float*>(p.grad.data()) + part.first)
              << p.name;
          const std::vector<float> want = testing::ToFloats(alone.Get(p.name).value);
          for (int64_t i = 0; i < part.count; ++i) {
            ++owners[p.name][part.first + i];
            EXPECT_EQ(got[part.at + i], want[part.first + i]) << p.name << "[" << i << "]";
          }
        }
      }
      EXPECT_EQ(got_stack_slices, stack_slices.at({shards, shard})) << "shard " << shard;
    }
    for (const auto& [name, counts] : owners) {
      for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(counts[i], 1) << name << "[" << i << "]";
    }
  }
}

// Dense parameters around a stack of expert parameters (parts of bigger tensors, as a rank of an
// expert-parallel group holds them) and one expert parameter alone.
void CreateDenseAndExperts(ParameterSet& set) {
  using enum ReplicaGroup;
  set.Create({.name = "embed", .shape = {7, 50}});
  const ParameterSpec experts[] = {{.name = "experts.fc1",
                                    .shape = {4, 60},
                                    .replicas = kExpertData,
                                    .whole_shape = {8, 60},
                                    .first_row = 4},
                                   {.name = "experts.gate",
                                    .shape = {4, 60},
                                    .replicas = kExpertData,
                                    .whole_shape = {8, 60},
                                    .first_row = 4}};
  set.CreateStack(experts);
  set.Create({.name = "experts.fc2", .shape = {4, 30}, .replicas = kExpertData});
  set.Create({.name = "router", .shape = {4, 5}});
  set.Create({.name = "head", .shape = {3, 50}});
}

TEST(BucketedParameterSetTest, ShardsEachBucketOverItsReplicaGroup) {
  // Dense state in 2 shards, experts' in 3: the six (data shard, expert-data shard) pairs.
  constexpr int kDataShards = 2, kExpertShards = 3, kPairs = 6;
  std::map<std::string, std::vector<int>> owners;  // by element: how many of the pairs own it
  for (int pair = 0; pair < kPairs; ++pair) {
    const BucketSharding sharding{.data = {kDataShards, pair % kDataShards},
                                  .expert_data = {kExpertShards, pair % kExpertShards}};
    ParameterSet set = ParameterSet::Deferred(Device::CPU(), DType::kF32, /*seed=*/5);
    CreateDenseAndExperts(set);
    set.AllocateBuckets(sharding, /*bucket_bytes=*/int64_t{1} << 20);
    EXPECT_EQ(set.shards(ReplicaGroup::kData), kDataShards);
    EXPECT_EQ(set.shards(ReplicaGroup::kExpertData), kExpertShards);
    // {router, head}, {the experts}, {embed}.
    ASSERT_EQ(set.buckets().size(), 3u);
    for (const ParameterBucket& b : set.buckets()) {
      for (size_t i = b.layout.begin; i < b.layout.end; ++i) {
        EXPECT_EQ(set.specs()[i].replicas, b.layout.replicas) << set.specs()[i].name;
      }
      EXPECT_EQ(b.layout.shards, sharding[b.layout.replicas].shards);
      EXPECT_EQ(b.shard, sharding[b.layout.replicas].shard);
      EXPECT_EQ(b.exp_avg.numel() * b.layout.shards, b.layout.numel);
    }
    EXPECT_EQ(set.buckets()[1].layout.replicas, ReplicaGroup::kExpertData);
    for (const OwnedSlice& s : set.OwnedSlices()) {
      for (const testing::SlicePart& part : testing::SliceParts(set, s)) {
        const Parameter& p = *part.parameter;
        EXPECT_EQ(s.replicas,
                  p.name.starts_with("experts.") ? ReplicaGroup::kExpertData : ReplicaGroup::kData)
            << p.name;
        std::vector<int>& counts = owners[p.name];
        counts.resize(p.value.numel());
        for (int64_t i = 0; i < part.count; ++i) ++counts[part.first + i];
      }
    }
  }
  ASSERT_EQ(owners.size(), 6u);
  for (const auto& [name, counts] : owners) {
    // Each shard of a group appears kPairs / shards times among the pairs.
    const int want = kPairs / (name.starts_with("experts.") ? kExpertShards : kDataShards);
    for (size_t i = 0; i < counts.size(); ++i)
      ASSERT_EQ(counts[i], want) << name << "[" << i << "]";
  }
}

}  // namespace
}  // namespace moe
