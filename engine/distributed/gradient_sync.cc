#include "engine/distributed/gradient_sync.h"

#include <algorithm>

#include <glog/logging.h>

#include "engine/runtime/step_timeline.h"

namespace moe {

GradientSync::GradientSync(Communicator& data, const ParameterSet& parameters, Stream& compute)
    : data_(data), compute_(compute) {
  CHECK(data.size() > 1) << "a gradient all-reduce over one replica";
  for (const auto& p : parameters.all()) pending_.push_back(p.get());
}

void GradientSync::GradsFinal(const std::string& prefix) {
  const auto stays_pending = [&](const Parameter* p) { return !p->name.starts_with(prefix); };
  const auto first_reduced = std::stable_partition(pending_.begin(), pending_.end(), stays_pending);
  if (first_reduced == pending_.end()) return;
  for (auto it = first_reduced; it != pending_.end(); ++it) MaterializedGrad(**it);
  const std::unique_ptr<Event> produced = compute_.CreateEvent();
  produced->Record(compute_);
  data_.stream().Wait(*produced);
  StepTimeline* timeline = TracingTimeline(compute_.device());
  const int span = timeline == nullptr
                       ? -1
                       : timeline->BeginSpan(TraceTrack::kDataParallelComm, data_.stream(),
                                             "all-reduce " + (prefix.empty() ? "rest" : prefix));
  for (auto it = first_reduced; it != pending_.end(); ++it) data_.AllReduceSum((*it)->grad);
  if (timeline != nullptr) timeline->EndSpan(span, data_.stream());
  pending_.erase(first_reduced, pending_.end());
}

void GradientSync::Finish() {
  GradsFinal("");
  const std::unique_ptr<Event> reduced = data_.stream().CreateEvent();
  reduced->Record(data_.stream());
  compute_.Wait(*reduced);
}

}  // namespace moe
