#include "engine/distributed/weight_gather.h"

#include <glog/logging.h>

#include "engine/runtime/step_timeline.h"

namespace moe {

void GatherUpdatedWeights(Communicator& data, const ParameterSet& parameters, Stream& compute) {
  CHECK_EQ(parameters.shards(), data.size()) << "weights gathered over another group";
  const std::vector<ParameterBucket>& buckets = parameters.buckets();
  StepTimeline* timeline = TracingTimeline(compute.device());
  EnqueueBetween(data, compute, [&] {
    for (size_t b = buckets.size(); b-- > 0;) {
      const ParameterBucket& bucket = buckets[b];
      const int span = timeline == nullptr
                           ? -1
                           : timeline->BeginSpan(TraceTrack::kDataParallelComm, data.stream(),
                                                 "all-gather bucket " + std::to_string(b));
      data.AllGather(bucket.value.Rows(bucket.owned_begin(), bucket.owned_end()), bucket.value);
      if (timeline != nullptr) timeline->EndSpan(span, data.stream());
    }
  });
}

}  // namespace moe
