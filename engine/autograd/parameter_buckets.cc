#include "engine/autograd/parameter_buckets.h"

#include <algorithm>

#include <glog/logging.h>

namespace moe {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

std::vector<BucketLayout> PlanBuckets(std::span<const int64_t> numels,
                                      std::span<const bool> joins_previous,
                                      std::span<const ReplicaGroup> replicas,
                                      const BucketSharding& sharding, int64_t target_bytes) {
  CHECK_EQ(numels.size(), joins_previous.size());
  CHECK_EQ(numels.size(), replicas.size());
  CHECK(numels.empty() || !joins_previous.front()) << "the first parameter continues no stack";
  for (size_t i = 1; i < numels.size(); ++i) {
    CHECK(!joins_previous[i] || replicas[i] == replicas[i - 1])
        << "stack member " << i << " is of another replica group than the member before it";
  }
  for (ReplicaGroup group : kReplicaGroups) CHECK_GE(sharding[group].shards, 1);
  CHECK_GE(target_bytes, 1);
  std::vector<BucketLayout> buckets;
  size_t end = numels.size();
  while (end > 0) {
    size_t begin = end;
    int64_t bytes = 0;
    const ReplicaGroup group = replicas[end - 1];
    while (begin > 0 && replicas[begin - 1] == group) {
      // The parameter before `begin` with the rest of its stack: [first, begin).
      size_t first = begin - 1;
      while (joins_previous[first]) --first;
      int64_t next = 0;
      for (size_t i = first; i < begin; ++i) next += numels[i] * int64_t{sizeof(float)};
      if (begin < end && bytes + next > target_bytes) break;  // starts the next bucket
      bytes += next;
      begin = first;
    }
    BucketLayout bucket;
    bucket.begin = begin;
    bucket.end = end;
    bucket.replicas = group;
    bucket.shards = sharding[group].shards;
    int64_t next = 0;
    for (size_t i = begin; i < end; ++i) {
      CHECK_GE(numels[i], 0);
      if (!joins_previous[i]) next = RoundUp(next, kBucketAlignment);
      bucket.offsets.push_back(next);
      next += numels[i];
    }
    bucket.numel = RoundUp(std::max<int64_t>(next, 1), bucket.shards * kBucketAlignment);
    buckets.push_back(std::move(bucket));
    end = begin;
  }
  return buckets;
}

ParameterRange IntersectParameter(int64_t offset, int64_t numel, int64_t begin, int64_t end) {
  const int64_t first = std::clamp(begin - offset, int64_t{0}, numel);
  const int64_t last = std::clamp(end - offset, first, numel);
  return {first, last};
}

}  // namespace moe
