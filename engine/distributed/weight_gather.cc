#include "engine/distributed/weight_gather.h"

#include <algorithm>

#include <glog/logging.h>

namespace moe {

WeightGather::WeightGather(Communicator& data, const ParameterSet& parameters, Stream& compute)
    : data_(data),
      parameters_(parameters),
      compute_(compute),
      gathered_(parameters.buckets().size()) {
  CHECK_EQ(parameters.shards(), data.size()) << "weights gathered over another group";
  CHECK(compute.device() == data.device());
}

void WeightGather::Start() {
  const std::vector<ParameterBucket>& buckets = parameters_.buckets();
  const std::unique_ptr<Event> updated = compute_.CreateEvent();
  updated->Record(compute_);
  data_.stream().Wait(*updated);
  for (size_t b = buckets.size(); b-- > 0;) {
    CHECK(gathered_[b] == nullptr) << "a weight gather started before the last was waited for";
    const ParameterBucket& bucket = buckets[b];
    data_.AllGather(bucket.value.Rows(bucket.owned_begin(), bucket.owned_end()), bucket.value);
    gathered_[b] = data_.stream().CreateEvent();
    gathered_[b]->Record(data_.stream());
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
