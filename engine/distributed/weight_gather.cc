#include "engine/distributed/weight_gather.h"

#include <algorithm>

#include <glog/logging.h>

namespace moe {

WeightGather::WeightGather(const ReplicaCommunicators& groups, const ParameterSet& parameters,
                           Stream& compute)
    : groups_(groups),
      parameters_(parameters),
      compute_(compute),
      gathered_(parameters.buckets().size()) {
  for (const ParameterBucket& bucket : parameters.buckets()) {
    if (bucket.layout.shards == 1) continue;
    const Communicator* group = groups[bucket.layout.replicas];
    CHECK(group != nullptr && group->size() == bucket.layout.shards)
        << "weights gathered over another group than the "
        << ReplicaGroupName(bucket.layout.replicas) << " group's " << bucket.layout.shards
        << " shards";
    CHECK(compute.device() == group->device());
  }
}

void WeightGather::Start() {
  const std::vector<ParameterBucket>& buckets = parameters_.buckets();
  const std::unique_ptr<Event> updated = compute_.CreateEvent();
  updated->Record(compute_);
  std::vector<Communicator*> waited;  // the streams that wait for `updated`
  for (size_t b = buckets.size(); b-- > 0;) {
    CHECK(gathered_[b] == nullptr) << "a weight gather started before the last was waited for";
    const ParameterBucket& bucket = buckets[b];
    if (bucket.layout.shards == 1) continue;
    Communicator* group = groups_[bucket.layout.replicas];
    if (std::find(waited.begin(), waited.end(), group) == waited.end()) {
      group->stream().Wait(*updated);
      waited.push_back(group);
    }
    group->AllGather(bucket.value.Rows(bucket.owned_begin(), bucket.owned_end()), bucket.value);
    gathered_[b] = group->stream().CreateEvent();
    gathered_[b]->Record(group->stream());
  }
}

void WeightGather::WaitFor(const std::string& prefix) {
  const std::vector<ParameterBucket>& buckets = parameters_.buckets();
  const auto& all = parameters_.all();
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (gathered_[b] == nullptr) continue;
    const BucketLayout& layout = buckets[b].layout;
    const bool needed = std::any_of(all.begin() + layout.begin, all.begin() + layout.end,
                                    [&](const auto& p) { return p->name.starts_with(prefix); });
    if (!needed) continue;
    compute_.Wait(*gathered_[b]);
    gathered_[b].reset();
  }
}

void WeightGather::WaitAll() { WaitFor(""); }

}  // namespace moe
