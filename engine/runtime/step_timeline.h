// StepTimeline: where one training step's time goes, read from events on the device's streams.
//
// Phases (always on). From BeginStep to EndStep the compute stream's time is cut into consecutive
// intervals by markers: timing events recorded on the compute stream, one per SetPhase. Each
// interval belongs to the phase that was current when it began. The phases therefore partition
// the step's compute-stream span exactly, so they add up to it by construction; that span is the
// step's wall time up to the host work before BeginStep's marker and after EndStep's (a step ends
// with a host synchronisation, so its last marker completes when the host records it). CPU: the
// compute stream runs inline, so a marker is the host's clock when it is recorded.
//
// Trace (for chosen steps: BeginStep(trace=true)). Spans (BeginSpan/EndSpan: a timing event on the
// span's stream at each end), instant events, and a device-memory counter sampled at every marker
// and every compute-stream span end (the caching allocator's allocated bytes when the host records
// the event, which is the stream-ordered allocator's state at that point of the compute stream).
// Events with the same flow id are one flow (e.g. a saved group's commit, its copy out, its copy
// back, its first use). Times are microseconds since the first traced step's first marker.
// Without trace, the span, instant and counter calls return at once.
//
// Who marks what: the trainer (optimizer, data-parallel wait, other), the pipeline executor
// (forward, backward, pipeline wait), the offload manager (offload wait, inside backward), the
// MoE layer (expert-parallel wait, inside forward and backward). Code
// reaches the step's timeline through DeviceContext::timeline() (nullptr outside a training step);
// PhaseScope and TraceSpan are the no-op-when-absent helpers. Not thread-safe: one host thread.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/stream.h"

namespace moe {

enum class StepPhase {
  kForward,
  kBackward,
  kOptimizer,           // gradient norm, clipping, update, zeroing
  kPipelineWait,        // compute waiting on pipeline sends/receives (the bubble)
  kDataParallelWait,    // compute waiting on the data-parallel gradient all-reduce
  kOffloadWait,         // compute waiting on an offloaded group's reload
  kExpertParallelWait,  // compute waiting on the expert-parallel token exchanges (all-to-alls)
  kOther,               // everything else: host gaps, data upload, the step's statistics
};
inline constexpr int kNumStepPhases = 8;
// "forward", "backward", "optimizer", "pipeline_wait", "data_parallel_wait", "offload_wait",
// "expert_parallel_wait", "other": the metrics file's field stems.
const char* StepPhaseName(StepPhase phase);

struct StepBreakdown {
  std::array<double, kNumStepPhases> ms{};  // by StepPhase

  double& operator[](StepPhase phase) { return ms[static_cast<int>(phase)]; }
  double operator[](StepPhase phase) const { return ms[static_cast<int>(phase)]; }
  double total_ms() const;
  StepBreakdown& operator+=(const StepBreakdown& other);
};

// The streams a trace shows, one track each per rank.
enum class TraceTrack {
  kCompute,
  kDeviceToHost,
  kHostToDevice,
  kPipelineComm,
  kDataParallelComm,
  kExpertParallelComm,
};
inline constexpr int kNumTraceTracks = 6;
const char* TraceTrackName(TraceTrack track);  // "compute", "offload D2H", ...

struct TraceEvent {
  enum class Kind { kSpan, kInstant, kCounter };
  Kind kind = Kind::kSpan;
  TraceTrack track = TraceTrack::kCompute;
  std::string name;
  double start_us = 0;
  double end_us = 0;  // spans; = start_us otherwise
  double value = 0;   // counters: device memory allocated, MiB
  int64_t flow = -1;  // >= 0: a member of that flow
};

struct TimelineStep {
  StepBreakdown breakdown;
  std::vector<TraceEvent> trace;  // empty unless the step was traced
};

class StepTimeline {
 public:
  explicit StepTimeline(Device device);
  ~StepTimeline();
  StepTimeline(const StepTimeline&) = delete;
  StepTimeline& operator=(const StepTimeline&) = delete;

  // Starts a step in phase kOther; with `trace`, also records spans, instants and memory.
  void BeginStep(bool trace);
  // Waits for the step's events and returns its breakdown (and trace). The step's last marker is
  // recorded here.
  TimelineStep EndStep();

  bool tracing() const { return tracing_; }
  StepPhase phase() const { return phase_; }
  // Records a marker on the compute stream and makes `phase` current; returns the previous one.
  StepPhase SetPhase(StepPhase phase);

  // Trace only. A span on `track`, recorded on `stream` (a stream of this device); ids are valid
  // until EndStep. `layer` >= 0 prefixes the name with "layer <layer> ".
  int BeginSpan(TraceTrack track, Stream& stream, const std::string& name, int layer = -1,
                int64_t flow = -1);
  void EndSpan(int span, Stream& stream);
  void Instant(TraceTrack track, Stream& stream, const std::string& name, int layer = -1,
               int64_t flow = -1);
  // A new flow id (unique over the timeline's life).
  int64_t NewFlow() { return next_flow_++; }

 private:
  struct Mark;
  int Record(Stream& stream);    // a pooled timing event recorded on `stream` now; its index
  void Marker(StepPhase opens);  // a marker on the compute stream opening `opens`'s interval
  void SampleMemory(int event);

  const Device device_;
  Stream& compute_;
  std::vector<std::unique_ptr<Event>> pool_;
  size_t used_ = 0;                // events of the pool taken this step
  std::unique_ptr<Event> origin_;  // the first traced step's first marker
  bool origin_recorded_ = false;
  bool in_step_ = false;
  bool tracing_ = false;
  StepPhase phase_ = StepPhase::kOther;
  std::vector<std::pair<int, StepPhase>> markers_;  // (event, phase of the interval it opens)
  std::vector<Mark> marks_;                         // trace records, by span id
  int64_t next_flow_ = 0;
};

// Makes `phase` current on the device's timeline for a scope, then restores the previous one.
class PhaseScope {
 public:
  PhaseScope(Device device, StepPhase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  StepTimeline* timeline_;
  StepPhase previous_ = StepPhase::kOther;
};

// The device's timeline if it is tracing this step, else nullptr.
StepTimeline* TracingTimeline(Device device);

// A traced span for a scope on the device's compute stream (a no-op unless tracing).
class TraceSpan {
 public:
  TraceSpan(Device device, const char* what, int layer = -1);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  StepTimeline* timeline_;
  Stream* stream_ = nullptr;
  int span_ = -1;
};

}  // namespace moe
