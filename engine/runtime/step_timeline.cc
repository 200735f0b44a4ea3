#include "engine/runtime/step_timeline.h"

#include <glog/logging.h>

#include "engine/core/byte_units.h"
#include "engine/runtime/device_context.h"

namespace moe {

const char* StepPhaseName(StepPhase phase) {
  switch (phase) {
    case StepPhase::kForward:
      return "forward";
    case StepPhase::kBackward:
      return "backward";
    case StepPhase::kOptimizer:
      return "optimizer";
    case StepPhase::kPipelineWait:
      return "pipeline_wait";
    case StepPhase::kDataParallelWait:
      return "data_parallel_wait";
    case StepPhase::kOffloadWait:
      return "offload_wait";
    case StepPhase::kExpertParallelWait:
      return "expert_parallel_wait";
    case StepPhase::kOther:
      return "other";
  }
  return "?";
}

const char* TraceTrackName(TraceTrack track) {
  switch (track) {
    case TraceTrack::kCompute:
      return "compute";
    case TraceTrack::kDeviceToHost:
      return "offload D2H";
    case TraceTrack::kHostToDevice:
      return "offload H2D";
    case TraceTrack::kPipelineComm:
      return "pipeline comm";
    case TraceTrack::kDataParallelComm:
      return "data-parallel comm";
    case TraceTrack::kExpertParallelComm:
      return "expert-parallel comm";
  }
  return "?";
}

double StepBreakdown::total_ms() const {
  double total = 0;
  for (double m : ms) total += m;
  return total;
}

StepBreakdown& StepBreakdown::operator+=(const StepBreakdown& other) {
  for (int i = 0; i < kNumStepPhases; ++i) ms[i] += other.ms[i];
  return *this;
}

struct StepTimeline::Mark {
  TraceEvent::Kind kind;
  TraceTrack track;
  std::string name;
  int64_t flow;
  int begin;     // event index
  int end;       // event index (spans; -1 until EndSpan)
  double value;  // counters
};

StepTimeline::StepTimeline(Device device)
    : device_(device), compute_(DeviceContext::Get(device).compute_stream()) {}

StepTimeline::~StepTimeline() = default;

namespace {

std::string SpanName(const std::string& name, int layer) {
  return layer >= 0 ? "layer " + std::to_string(layer) + " " + name : name;
}

}  // namespace

int StepTimeline::Record(Stream& stream) {
  if (used_ == pool_.size()) pool_.push_back(compute_.CreateEvent(/*enable_timing=*/true));
  pool_[used_]->Record(stream);
  return static_cast<int>(used_++);
}

void StepTimeline::Marker(StepPhase opens) {
  const int event = Record(compute_);
  markers_.push_back({event, opens});
  if (tracing_) SampleMemory(event);
}

void StepTimeline::SampleMemory(int event) {
  const double mib = DeviceContext::Get(device_).allocator().stats().allocated_bytes / kMiB;
  marks_.push_back(
      {TraceEvent::Kind::kCounter, TraceTrack::kCompute, "device memory", -1, event, event, mib});
}

void StepTimeline::BeginStep(bool trace) {
  CHECK(!in_step_) << "BeginStep twice without EndStep";
  in_step_ = true;
  tracing_ = trace;
  if (trace && !origin_recorded_) {
    origin_ = compute_.CreateEvent(/*enable_timing=*/true);
    origin_->Record(compute_);
    origin_recorded_ = true;
  }
  phase_ = StepPhase::kOther;
  Marker(phase_);
}

StepPhase StepTimeline::SetPhase(StepPhase phase) {
  CHECK(in_step_) << "SetPhase outside a step";
  const StepPhase previous = phase_;
  if (phase == phase_) return previous;
  Marker(phase);
  phase_ = phase;
  return previous;
}

int StepTimeline::BeginSpan(TraceTrack track, Stream& stream, const std::string& name, int layer,
                            int64_t flow) {
  if (!tracing_) return -1;
  const int event = Record(stream);
  marks_.push_back({TraceEvent::Kind::kSpan, track, SpanName(name, layer), flow, event, -1, 0});
  return static_cast<int>(marks_.size() - 1);
}

void StepTimeline::EndSpan(int span, Stream& stream) {
  if (!tracing_ || span < 0) return;
  CHECK_LT(span, static_cast<int>(marks_.size()));
  CHECK_EQ(marks_[span].end, -1) << marks_[span].name << " ended twice";
  marks_[span].end = Record(stream);
  if (marks_[span].track == TraceTrack::kCompute) SampleMemory(marks_[span].end);
}

void StepTimeline::Instant(TraceTrack track, Stream& stream, const std::string& name, int layer,
                           int64_t flow) {
  if (!tracing_) return;
  const int event = Record(stream);
  marks_.push_back(
      {TraceEvent::Kind::kInstant, track, SpanName(name, layer), flow, event, event, 0});
}

TimelineStep StepTimeline::EndStep() {
  CHECK(in_step_) << "EndStep without BeginStep";
  Marker(phase_);  // the last marker: it closes the current phase's interval
  TimelineStep out;
  const Event& first = *pool_[markers_.front().first];
  double previous = 0;
  for (size_t i = 1; i < markers_.size(); ++i) {
    const double t = pool_[markers_[i].first]->ElapsedMillisecondsSince(first);
    out.breakdown[markers_[i - 1].second] += t - previous;
    previous = t;
  }
  if (tracing_) {
    const auto us = [&](int event) {
      return 1e3 * pool_[event]->ElapsedMillisecondsSince(*origin_);
    };
    for (const Mark& mark : marks_) {
      CHECK(mark.end >= 0) << "span " << mark.name << " never ended";
      TraceEvent e;
      e.kind = mark.kind;
      e.track = mark.track;
      e.name = mark.name;
      e.start_us = us(mark.begin);
      e.end_us = mark.end == mark.begin ? e.start_us : us(mark.end);
      e.value = mark.value;
      e.flow = mark.flow;
      out.trace.push_back(std::move(e));
    }
  }
  markers_.clear();
  marks_.clear();
  used_ = 0;
  in_step_ = false;
  tracing_ = false;
  phase_ = StepPhase::kOther;
  return out;
}

PhaseScope::PhaseScope(Device device, StepPhase phase)
    : timeline_(DeviceContext::Get(device).timeline()) {
  if (timeline_ != nullptr) previous_ = timeline_->SetPhase(phase);
}

PhaseScope::~PhaseScope() {
  if (timeline_ != nullptr) timeline_->SetPhase(previous_);
}

StepTimeline* TracingTimeline(Device device) {
  StepTimeline* timeline = DeviceContext::Get(device).timeline();
  return timeline != nullptr && timeline->tracing() ? timeline : nullptr;
}

TraceSpan::TraceSpan(Device device, const char* what, int layer)
    : timeline_(TracingTimeline(device)) {
  if (timeline_ == nullptr) return;
  stream_ = &DeviceContext::Get(device).compute_stream();
  span_ = timeline_->BeginSpan(TraceTrack::kCompute, *stream_, what, layer);
}

TraceSpan::~TraceSpan() {
  if (timeline_ != nullptr) timeline_->EndSpan(span_, *stream_);
}

}  // namespace moe
