// Bucket layout: how a model's parameters lie in flat buffers (ParameterSet::AllocateBuckets), so
// that the data-parallel group reduces one buffer per bucket, and, with the optimizer state
// sharded over `shards` ranks, which part of every buffer each rank owns.
//
// Buckets hold consecutive parameters. They are formed in reverse creation order, the order in
// which backward finishes gradients (the head's first, the embedding's last): a parameter joins
// the open bucket while the bucket's f32 gradients stay within `target_bytes`, else it opens the
// next, so small parameters (norms, routers, a layer's projections) coalesce and a parameter
// larger than the target is a bucket of its own. A stack (parameters that one GEMM uses as one
// matrix, ParameterStack) joins or opens a bucket as a whole: a bucket never splits it, and one
// larger than the target is a bucket of its own.
// A bucket never mixes replica groups (replica_group.h): a parameter of another group than the
// open bucket's opens the next (a stack's members share one group), so every bucket is reduced
// and sharded over one group, in that group's number of shards.
// The result lists buckets in that order (bucket 0 holds the last parameters).
//
// Inside a bucket the parameters keep creation order. Each parameter, or each stack as a whole,
// starts at a multiple of kBucketAlignment elements (a stack's later members start right after the
// member before them, no padding between) and the bucket's length is padded to a multiple of
// shards x kBucketAlignment (its group's shards), so every parameter and stack view and every
// rank's part is 16-byte aligned (the vectorised kernels and NCCL want that) and the buffer splits
// into `shards` equal parts: the group's rank r owns elements [r * numel / shards,
// (r + 1) * numel / shards) of each bucket (its shard). Padding is never a parameter's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/autograd/replica_group.h"

namespace moe {

inline constexpr int64_t kBucketAlignment = 128;  // elements: 512 bytes of f32, 256 of bf16

struct BucketLayout {
  size_t begin = 0;              // parameters [begin, end), by creation index
  size_t end = 0;                //
  std::vector<int64_t> offsets;  // element offset of parameter begin + i, creation order
  int64_t numel = 0;             // padded length of the bucket's buffers
  ReplicaGroup replicas = ReplicaGroup::kData;  // its parameters' group
  int shards = 1;                               // that group's

  int64_t shard_numel() const { return numel / shards; }
  // Elements [shard_begin(r), shard_begin(r) + shard_numel()) belong to rank r.
  int64_t shard_begin(int rank) const { return rank * shard_numel(); }
};

// How the optimizer state of one replica group's buckets is sharded: over `shards` ranks of the
// group, of which this rank owns part `shard`.
struct StateShard {
  int shards = 1;
  int shard = 0;
};
using BucketSharding = ByReplicaGroup<StateShard>;

// Buckets for parameters of `numels` elements each (creation order), in backward order (above).
// joins_previous[i]: parameter i continues the stack of parameter i - 1 (false for the first
// parameter, and for every parameter outside a stack); replicas[i]: parameter i's group. Each
// bucket is padded for its group's sharding.shards (>= 1; the shard indices are not read).
// target_bytes >= 1.
std::vector<BucketLayout> PlanBuckets(std::span<const int64_t> numels,
                                      std::span<const bool> joins_previous,
                                      std::span<const ReplicaGroup> replicas,
                                      const BucketSharding& sharding, int64_t target_bytes);

// The part of one parameter inside the element range [begin, end) of its bucket: elements
// [first, last) of the parameter (flattened), which sit at bucket elements
// [offset + first, offset + last). Empty (first == last) when they do not meet.
struct ParameterRange {
  int64_t first = 0;
  int64_t last = 0;
  bool empty() const { return first == last; }
};
ParameterRange IntersectParameter(int64_t offset, int64_t numel, int64_t begin, int64_t end);

}  // namespace moe
