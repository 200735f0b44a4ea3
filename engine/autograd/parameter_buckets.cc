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
                                      std::span<const bool> joins_previous, int shards,
                                      int64_t target_bytes) {
  CHECK_EQ(numels.size(), joins_previous.size());
  CHECK(numels.empty() || !joins_previous.front()) << "the first parameter continues no stack";
  CHECK_GE(shards, 1);
  CHECK_GE(target_bytes, 1);
  std::vector<BucketLayout> buckets;
  size_t end = numels.size();
  while (end > 0) {
    size_t begin = end;
    int64_t bytes = 0;
    while (begin > 0) {
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
    bucket.shards = shards;
    int64_t next = 0;
    for (size_t i = begin; i < end; ++i) {
      CHECK_GE(numels[i], 0);
      if (!joins_previous[i]) next = RoundUp(next, kBucketAlignment);
      bucket.offsets.push_back(next);
      next += numels[i];
    }
    bucket.numel = RoundUp(std::max<int64_t>(next, 1), shards * kBucketAlignment);
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
