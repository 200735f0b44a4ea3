// Bucket layout (parameter_buckets.h) and a bucketed ParameterSet: buckets coalesce consecutive
// parameters in reverse creation order up to the target, parameters and shards start aligned,
// a bucket splits into equal shards; a bucketed set starts from the plain set's values, its
// parameters' tensors are views of the bucket buffers, and the shards' owned slices cover every
// element of every parameter exactly once.
#include "engine/autograd/parameter_buckets.h"

#include <gtest/gtest.h>

#include <map>

#include "engine/autograd/parameters.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

TEST(PlanBucketsTest, CoalescesInReverseCreationOrderUpToTheTarget) {
  // f32 bytes: 400, 40, 4000, 40, 40, 400; target 480 bytes.
  const std::vector<int64_t> numels = {100, 10, 1000, 10, 10, 100};
  const std::vector<BucketLayout> buckets = PlanBuckets(numels, /*shards=*/1, 480);
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
  for (int shards : {1, 2, 3, 8}) {
    const std::vector<BucketLayout> buckets = PlanBuckets(numels, shards, int64_t{1} << 20);
    ASSERT_EQ(buckets.size(), 1u);
    const BucketLayout& b = buckets[0];
    EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 384}));
    EXPECT_EQ(b.numel % (shards * kBucketAlignment), 0) << shards;
    EXPECT_GE(b.numel, 384 + 5);
    EXPECT_EQ(b.shard_numel() * shards, b.numel);
    EXPECT_EQ(b.shard_begin(shards - 1), (shards - 1) * b.shard_numel());
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
  bucketed.AllocateBuckets(/*shards=*/1, /*shard=*/0, /*bucket_bytes=*/200 * 4);
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

// Element (parameter, index) -> how many shards own it.
TEST(BucketedParameterSetTest, ShardsOwnEveryElementOnce) {
  constexpr int kShards = 3;
  ParameterSet plain(Device::CPU(), DType::kF32, /*seed=*/5);
  for (const ParameterSpec& spec : Specs()) plain.Create(spec);
  std::map<std::string, std::vector<int>> owners;
  for (const auto& p : plain.all()) owners[p->name].assign(p->value.numel(), 0);
  for (int shard = 0; shard < kShards; ++shard) {
    ParameterSet set = ParameterSet::Deferred(Device::CPU(), DType::kF32, /*seed=*/5);
    for (const ParameterSpec& spec : Specs()) set.Create(spec);
    set.AllocateBuckets(kShards, shard, /*bucket_bytes=*/200 * 4);
    EXPECT_EQ(set.shards(), kShards);
    for (const auto& p : set.all()) EXPECT_FALSE(p->exp_avg.defined()) << p->name;
    for (const OwnedSlice& s : set.OwnedSlices()) {
      const Parameter& p = *s.parameter;
      // The slice's place in the parameter: its value view's offset from the parameter's.
      const auto* base = static_cast<const float*>(p.value.data());
      const int64_t first = static_cast<const float*>(s.value.data()) - base;
      ASSERT_GE(first, 0);
      ASSERT_LE(first + s.value.numel(), p.value.numel());
      EXPECT_EQ(s.master.numel(), s.value.numel());
      EXPECT_EQ(s.exp_avg.numel(), s.value.numel());
      EXPECT_EQ(static_cast<const float*>(s.grad.data()) - static_cast<const float*>(p.grad.data()),
                first);
      // The CPU master is the value itself, and starts from the plain set's values.
      EXPECT_EQ(s.master.data(), s.value.data());
      const std::vector<float> want = testing::ToFloats(plain.Get(p.name).value);
      const std::vector<float> got = testing::ToFloats(s.master);
      for (int64_t i = 0; i < s.value.numel(); ++i) {
        ++owners[p.name][first + i];
        EXPECT_EQ(got[i], want[first + i]);
      }
    }
  }
  for (const auto& [name, counts] : owners) {
    for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(counts[i], 1) << name << "[" << i << "]";
  }
}

}  // namespace
}  // namespace moe
