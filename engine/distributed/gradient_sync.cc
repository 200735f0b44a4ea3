#include "engine/distributed/gradient_sync.h"

#include <algorithm>

#include <glog/logging.h>

#include "engine/runtime/step_timeline.h"

namespace moe {

GradientSync::GradientSync(Communicator& data, const ParameterSet& parameters, Stream& compute)
    : data_(data),
      parameters_(parameters),
      compute_(compute),
      final_(parameters.all().size(), false),
      issued_(parameters.buckets().size(), false) {
  CHECK(data.size() > 1) << "a gradient reduction over one replica";
  CHECK(!parameters.buckets().empty()) << "gradient reduction of parameters without buckets";
  CHECK(parameters.shards() == 1 || parameters.shards() == data.size())
      << "optimizer state in " << parameters.shards() << " shards over " << data.size()
      << " replicas";
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
  data_.stream().Wait(*produced);
  StepTimeline* timeline = TracingTimeline(compute_.device());
  const bool sharded = parameters_.shards() > 1;
  for (size_t b : ready) {
    const ParameterBucket& bucket = buckets[b];
    const int span = timeline == nullptr
                         ? -1
                         : timeline->BeginSpan(
                               TraceTrack::kDataParallelComm, data_.stream(),
                               std::string(sharded ? "reduce-scatter" : "all-reduce") + " bucket " +
                                   std::to_string(b) + " (" + all[bucket.layout.begin]->name +
                                   " .. " + all[bucket.layout.end - 1]->name + ")");
    if (sharded) {
      data_.ReduceScatterSum(bucket.grad,
                             bucket.grad.Rows(bucket.owned_begin(), bucket.owned_end()));
    } else {
      data_.AllReduceSum(bucket.grad);
    }
    if (timeline != nullptr) timeline->EndSpan(span, data_.stream());
  }
}

void GradientSync::Finish() {
  GradsFinal("");
  const std::unique_ptr<Event> reduced = data_.stream().CreateEvent();
  reduced->Record(data_.stream());
  compute_.Wait(*reduced);
}

}  // namespace moe
