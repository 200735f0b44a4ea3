#include "engine/distributed/gradient_sync.h"

#include <algorithm>

#include <glog/logging.h>

#include "engine/runtime/step_timeline.h"

namespace moe {

GradientSync::GradientSync(const ReplicaCommunicators& groups, const ParameterSet& parameters,
                           Stream& compute)
    : groups_(groups),
      parameters_(parameters),
      compute_(compute),
      final_(parameters.all().size(), false),
      issued_(parameters.buckets().size(), false) {
  CHECK(groups.data != nullptr && groups.data->size() > 1)
      << "a gradient reduction over one replica";
  CHECK(!parameters.buckets().empty()) << "gradient reduction of parameters without buckets";
  for (size_t b = 0; b < parameters.buckets().size(); ++b) {
    const BucketLayout& layout = parameters.buckets()[b].layout;
    const Communicator* reducer = ReducerOf(b);
    CHECK(layout.shards == 1 || groups_[layout.replicas] == nullptr ||
          (reducer != nullptr && layout.shards == reducer->size()))
        << "bucket " << b << ": optimizer state in " << layout.shards << " shards over "
        << (reducer != nullptr ? reducer->size() : 1) << " " << ReplicaGroupName(layout.replicas)
        << " replicas";
  }
}

Communicator* GradientSync::ReducerOf(size_t b) const {
  Communicator* group = groups_[parameters_.buckets()[b].layout.replicas];
  return group != nullptr && group->size() > 1 ? group : nullptr;
}

void GradientSync::GradsFinal(const std::string& prefix) {
  const auto& all = parameters_.all();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]->name.starts_with(prefix)) final_[i] = true;
  }
  const std::vector<ParameterBucket>& buckets = parameters_.buckets();
  std::vector<size_t> ready;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketLayout& layout = buckets[b].layout;
    if (issued_[b] || !std::all_of(final_.begin() + layout.begin, final_.begin() + layout.end,
                                   [](bool f) { return f; })) {
      continue;
    }
    ready.push_back(b);
    issued_[b] = true;
    for (size_t i = layout.begin; i < layout.end; ++i) MaterializedGrad(*all[i]);
  }
  if (ready.empty()) return;
  const std::unique_ptr<Event> produced = compute_.CreateEvent();
  produced->Record(compute_);
  std::vector<Communicator*> waited;  // the streams that wait for `produced`
  StepTimeline* timeline = TracingTimeline(compute_.device());
  for (size_t b : ready) {
    Communicator* group = ReducerOf(b);
    if (group == nullptr) continue;
    if (std::find(waited.begin(), waited.end(), group) == waited.end()) {
      group->stream().Wait(*produced);
      waited.push_back(group);
      if (std::find(used_.begin(), used_.end(), group) == used_.end()) used_.push_back(group);
    }
    const ParameterBucket& bucket = buckets[b];
    const bool sharded = bucket.layout.shards > 1;
    const bool expert = bucket.layout.replicas == ReplicaGroup::kExpertData;
    const int span = timeline == nullptr
                         ? -1
                         : timeline->BeginSpan(
                               TraceTrack::kDataParallelComm, group->stream(),
                               std::string(sharded ? "reduce-scatter" : "all-reduce") + " bucket " +
                                   std::to_string(b) + (expert ? " (expert-data)" : "") + " (" +
                                   all[bucket.layout.begin]->name + " .. " +
                                   all[bucket.layout.end - 1]->name + ")");
    if (sharded) {
      group->ReduceScatterSum(bucket.grad,
                              bucket.grad.Rows(bucket.owned_begin(), bucket.owned_end()));
    } else {
      group->AllReduceSum(bucket.grad);
    }
    if (timeline != nullptr) timeline->EndSpan(span, group->stream());
  }
}

void GradientSync::Finish() {
  GradsFinal("");
  for (Communicator* group : used_) {
    const std::unique_ptr<Event> reduced = group->stream().CreateEvent();
    reduced->Record(group->stream());
    compute_.Wait(*reduced);
  }
}

}  // namespace moe
