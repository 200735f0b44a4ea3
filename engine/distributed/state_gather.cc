#include "engine/distributed/state_gather.h"

#include <glog/logging.h>

#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"

namespace moe {

WholeBucketState GatherBucketState(const ReplicaCommunicators& groups,
                                   const ParameterSet& parameters, size_t bucket, int root) {
  const ParameterBucket& b = parameters.buckets().at(bucket);
  CHECK(groups[b.layout.replicas] != nullptr) << "a state gathered over no group";
  Communicator& data = *groups[b.layout.replicas];
  CHECK_EQ(b.layout.shards, data.size()) << "a state gathered over another group";
  const Tensor* const mine[] = {&b.master, &b.exp_avg, &b.exp_avg_sq};
  WholeBucketState whole;
  if (data.rank() == root) whole = parameters.NewWholeBucketState(bucket);
  const Tensor* const wholes[] = {&whole.master, &whole.exp_avg, &whole.exp_avg_sq};
  const int64_t part = b.layout.shard_numel();
  const auto part_of = [&](const Tensor& t, int rank) {
    return t.Rows(b.layout.shard_begin(rank), b.layout.shard_begin(rank) + part);
  };
  if (data.rank() == root) {
    for (int t = 0; t < 3; ++t) ops::Copy(*mine[t], part_of(*wholes[t], root));
  }
  EnqueueBetween(data, DeviceContext::Get(data.device()).compute_stream(), [&] {
    data.GroupStart();
    for (int t = 0; t < 3; ++t) {
      if (data.rank() != root) {
        data.Send(*mine[t], root);
        continue;
      }
      for (int rank = 0; rank < data.size(); ++rank) {
        if (rank != root) data.Recv(part_of(*wholes[t], rank), rank);
      }
    }
    data.GroupEnd();
  });
  return whole;
}

}  // namespace moe
