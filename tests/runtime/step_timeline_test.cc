// StepTimeline on the CPU device: the phases partition a step (each phase gets exactly the time
// spent in it, and they add up to the step's wall time); untraced steps record no trace and
// TracingTimeline is nullptr unless a traced step runs; traced spans nest and carry the layer
// prefix; spans on a side stream are timed by that stream's execution, not by the host's calls;
// the device-memory counter follows allocations.
#include "engine/runtime/step_timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/runtime/device_context.h"
#include "tests/testing/copy_latency.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void SleepMs(int ms) { std::this_thread::sleep_for(milliseconds(ms)); }

// Sets the timeline on the CPU device for one test and always resets it.
class OnCpu {
 public:
  explicit OnCpu(StepTimeline* timeline) {
    DeviceContext::Get(Device::CPU()).set_timeline(timeline);
  }
  ~OnCpu() { DeviceContext::Get(Device::CPU()).set_timeline(nullptr); }
};

// Sleeps of `ms` may overshoot; a phase that slept `ms` in total must read [ms, ms + 15).
void ExpectSlept(const StepBreakdown& b, StepPhase phase, double ms) {
  EXPECT_GE(b[phase], ms) << StepPhaseName(phase);
  EXPECT_LT(b[phase], ms + 15.0) << StepPhaseName(phase);
}

std::vector<TraceEvent> Select(const std::vector<TraceEvent>& trace, TraceEvent::Kind kind) {
  std::vector<TraceEvent> out;
  for (const TraceEvent& e : trace) {
    if (e.kind == kind) out.push_back(e);
  }
  return out;
}

const TraceEvent* Find(const std::vector<TraceEvent>& trace, const std::string& name) {
  for (const TraceEvent& e : trace) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

TEST(StepTimelineTest, PhasesPartitionTheStep) {
  StepTimeline timeline(Device::CPU());
  const OnCpu on_cpu(&timeline);
  // Twice: the second step reuses the first one's pooled events and must not inherit its times.
  for (int round = 0; round < 2; ++round) {
    const int scale = round + 1;
    const auto start = Clock::now();
    timeline.BeginStep(/*trace=*/false);
    EXPECT_EQ(timeline.phase(), StepPhase::kOther);
    EXPECT_EQ(timeline.SetPhase(StepPhase::kForward), StepPhase::kOther);
    SleepMs(20 * scale);
    EXPECT_EQ(timeline.SetPhase(StepPhase::kBackward), StepPhase::kForward);
    SleepMs(10);
    {
      const PhaseScope waiting(Device::CPU(), StepPhase::kOffloadWait);
      EXPECT_EQ(timeline.phase(), StepPhase::kOffloadWait);
      SleepMs(10);
    }
    EXPECT_EQ(timeline.phase(), StepPhase::kBackward) << "PhaseScope did not restore the phase";
    SleepMs(20 * scale);
    // Setting the current phase again is no new interval.
    EXPECT_EQ(timeline.SetPhase(StepPhase::kBackward), StepPhase::kBackward);
    const TimelineStep step = timeline.EndStep();
    const double wall_ms = MsSince(start);

    const StepBreakdown& b = step.breakdown;
    ExpectSlept(b, StepPhase::kForward, 20 * scale);
    ExpectSlept(b, StepPhase::kBackward, 10 + 20 * scale);  // both intervals, not the wait
    ExpectSlept(b, StepPhase::kOffloadWait, 10);
    EXPECT_GE(b[StepPhase::kOther], 0.0);
    EXPECT_LT(b[StepPhase::kOther], 5.0) << "no work ran in kOther";
    EXPECT_EQ(b[StepPhase::kOptimizer], 0.0);
    EXPECT_EQ(b[StepPhase::kPipelineWait], 0.0);
    EXPECT_EQ(b[StepPhase::kDataParallelWait], 0.0);
    EXPECT_NEAR(b.total_ms(), wall_ms, 1.0) << "the phases do not cover the step";
    EXPECT_TRUE(step.trace.empty());
    EXPECT_EQ(timeline.phase(), StepPhase::kOther) << "EndStep leaves the timeline idle";
  }
}

TEST(StepTimelineTest, BreakdownArithmetic) {
  StepBreakdown a, b;
  a[StepPhase::kForward] = 1.5;
  a[StepPhase::kOther] = 0.25;
  b[StepPhase::kForward] = 2.0;
  b[StepPhase::kOffloadWait] = 4.0;
  a += b;
  EXPECT_EQ(a[StepPhase::kForward], 3.5);
  EXPECT_EQ(a[StepPhase::kOffloadWait], 4.0);
  EXPECT_EQ(a.total_ms(), 3.5 + 0.25 + 4.0);
  EXPECT_STREQ(StepPhaseName(StepPhase::kDataParallelWait), "data_parallel_wait");
  EXPECT_STREQ(StepPhaseName(StepPhase::kOffloadWait), "offload_wait");
  EXPECT_STREQ(TraceTrackName(TraceTrack::kDeviceToHost), "offload D2H");
}

TEST(StepTimelineTest, UntracedStepsRecordNoTraceAndTracingTimelineIsNullUnlessTracing) {
  EXPECT_EQ(DeviceContext::Get(Device::CPU()).timeline(), nullptr);
  EXPECT_EQ(TracingTimeline(Device::CPU()), nullptr) << "no timeline set";
  StepTimeline timeline(Device::CPU());
  const OnCpu on_cpu(&timeline);
  EXPECT_EQ(TracingTimeline(Device::CPU()), nullptr) << "set, but no step runs";

  Stream& compute = DeviceContext::Get(Device::CPU()).compute_stream();
  timeline.BeginStep(/*trace=*/false);
  EXPECT_FALSE(timeline.tracing());
  EXPECT_EQ(TracingTimeline(Device::CPU()), nullptr) << "an untraced step";
  EXPECT_EQ(timeline.BeginSpan(TraceTrack::kCompute, compute, "ignored"), -1);
  timeline.EndSpan(-1, compute);
  timeline.Instant(TraceTrack::kCompute, compute, "ignored");
  { const TraceSpan span(Device::CPU(), "ignored", 0); }
  timeline.SetPhase(StepPhase::kForward);
  TimelineStep untraced = timeline.EndStep();
  EXPECT_TRUE(untraced.trace.empty());

  timeline.BeginStep(/*trace=*/true);
  EXPECT_EQ(TracingTimeline(Device::CPU()), &timeline);
  { const TraceSpan span(Device::CPU(), "recorded"); }
  const TimelineStep traced = timeline.EndStep();
  EXPECT_NE(Find(traced.trace, "recorded"), nullptr);
  EXPECT_EQ(TracingTimeline(Device::CPU()), nullptr) << "still tracing after EndStep";

  // The next untraced step records nothing, though the last one traced.
  timeline.BeginStep(/*trace=*/false);
  { const TraceSpan span(Device::CPU(), "ignored"); }
  EXPECT_TRUE(timeline.EndStep().trace.empty());
}

TEST(StepTimelineTest, ComputeSpansNestAndCarryTheLayerPrefix) {
  StepTimeline timeline(Device::CPU());
  const OnCpu on_cpu(&timeline);
  Stream& compute = DeviceContext::Get(Device::CPU()).compute_stream();
  const int64_t flow = timeline.NewFlow();
  EXPECT_NE(timeline.NewFlow(), flow) << "flow ids repeat";

  timeline.BeginStep(/*trace=*/true);
  {
    const TraceSpan outer(Device::CPU(), "forward m0 c0");
    SleepMs(2);
    {
      const TraceSpan inner(Device::CPU(), "attention forward", 3);
      SleepMs(5);
      timeline.Instant(TraceTrack::kCompute, compute, "attn_norm commit", 3, flow);
    }
    SleepMs(2);
    const TraceSpan second(Device::CPU(), "moe forward", 3);
    SleepMs(1);
  }
  const TimelineStep first = timeline.EndStep();

  const std::vector<TraceEvent> spans = Select(first.trace, TraceEvent::Kind::kSpan);
  ASSERT_EQ(spans.size(), 3u);
  const TraceEvent* outer = Find(spans, "forward m0 c0");
  const TraceEvent* inner = Find(spans, "layer 3 attention forward");
  const TraceEvent* second = Find(spans, "layer 3 moe forward");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr) << "the layer prefix is missing";
  ASSERT_NE(second, nullptr);
  for (const TraceEvent* e : {outer, inner, second}) {
    EXPECT_EQ(e->track, TraceTrack::kCompute);
    EXPECT_GE(e->start_us, 0.0) << e->name;
    EXPECT_EQ(e->flow, -1) << e->name;
  }
  EXPECT_GE(inner->start_us, outer->start_us + 2000);
  EXPECT_GE(inner->end_us - inner->start_us, 5000.0);
  EXPECT_LE(inner->end_us, second->start_us) << "sibling spans overlap";
  EXPECT_LE(second->end_us, outer->end_us);
  EXPECT_GE(outer->end_us - outer->start_us, 10000.0);
  EXPECT_LT(outer->end_us - outer->start_us, 10000.0 + 15000.0);

  const std::vector<TraceEvent> instants = Select(first.trace, TraceEvent::Kind::kInstant);
  ASSERT_EQ(instants.size(), 1u);
  EXPECT_EQ(instants[0].name, "layer 3 attn_norm commit");
  EXPECT_EQ(instants[0].flow, flow);
  EXPECT_EQ(instants[0].start_us, instants[0].end_us);
  EXPECT_GE(instants[0].start_us, inner->start_us);
  EXPECT_LE(instants[0].start_us, inner->end_us);

  // A later traced step keeps the first traced step's origin: its times continue.
  SleepMs(3);
  timeline.BeginStep(/*trace=*/true);
  { const TraceSpan later(Device::CPU(), "backward m0 c0"); }
  const TimelineStep next = timeline.EndStep();
  const TraceEvent* later = Find(next.trace, "backward m0 c0");
  ASSERT_NE(later, nullptr);
  EXPECT_GE(later->start_us, outer->end_us + 3000) << "the second traced step restarted at 0";
}

TEST(StepTimelineTest, SideStreamSpansAreTimedByTheStreamsExecution) {
  StepTimeline timeline(Device::CPU());
  const OnCpu on_cpu(&timeline);
  DeviceContext& context = DeviceContext::Get(Device::CPU());
  std::unique_ptr<Stream> side = context.CreateSideStream();
  std::vector<char> src(4096, 1), busy(4096), dst(4096);
  const testing::LatencyKnob knob(milliseconds(30));

  timeline.BeginStep(/*trace=*/true);
  timeline.Instant(TraceTrack::kCompute, context.compute_stream(), "begin");
  const auto host_start = Clock::now();
  side->CopyAsync(busy.data(), src.data(), src.size());  // the side stream is busy for 30 ms
  const int span = timeline.BeginSpan(TraceTrack::kDeviceToHost, *side, "copy", 1);
  side->CopyAsync(dst.data(), src.data(), src.size());  // the span's own 30 ms
  timeline.EndSpan(span, *side);
  const double host_ms = MsSince(host_start);
  const TimelineStep step = timeline.EndStep();
  EXPECT_LT(host_ms, 20.0) << "the side stream's calls blocked the host";

  const TraceEvent* begin = Find(step.trace, "begin");
  const TraceEvent* copy = Find(step.trace, "layer 1 copy");
  ASSERT_NE(begin, nullptr);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->track, TraceTrack::kDeviceToHost);
  EXPECT_GE(copy->start_us - begin->start_us, 30000.0) << "began before the stream reached it";
  EXPECT_GE(copy->end_us - copy->start_us, 30000.0) << "ended before its copy ran";
  EXPECT_LT(copy->end_us - copy->start_us, 30000.0 + 15000.0);
  EXPECT_EQ(dst[4095], 1) << "EndStep returned before the side stream's events completed";
  // Side-stream spans add no memory samples: the counter follows the compute stream only.
  int counters = 0;
  for (const TraceEvent& e : step.trace) counters += e.kind == TraceEvent::Kind::kCounter;
  EXPECT_EQ(counters, 2) << "BeginStep's and EndStep's markers";
}

TEST(StepTimelineTest, MemoryCounterFollowsAllocations) {
  StepTimeline timeline(Device::CPU());
  const OnCpu on_cpu(&timeline);
  constexpr int64_t kElements = 1 << 20;  // 4 MiB of f32
  timeline.BeginStep(/*trace=*/true);
  {
    const TraceSpan span(Device::CPU(), "allocate");  // ends (sampling memory) after t is freed
    const Tensor t = Tensor::Empty({kElements}, DType::kF32, Device::CPU());
    const TraceSpan held(Device::CPU(), "hold");  // ends (sampling memory) while t is alive
  }
  timeline.SetPhase(StepPhase::kForward);  // a marker after t is freed
  const TimelineStep step = timeline.EndStep();

  std::vector<TraceEvent> counters = Select(step.trace, TraceEvent::Kind::kCounter);
  // BeginStep, the ends of "hold" and "allocate", SetPhase, EndStep.
  ASSERT_EQ(counters.size(), 5u);
  std::stable_sort(counters.begin(), counters.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us;
  });
  for (const TraceEvent& c : counters) {
    EXPECT_EQ(c.name, "device memory");
    EXPECT_EQ(c.track, TraceTrack::kCompute);
    EXPECT_GE(c.value, 0.0);
  }
  const double before = counters[0].value;
  EXPECT_GE(counters[1].value, before + 4.0) << "the 4 MiB tensor is missing at the span end";
  EXPECT_NEAR(counters[2].value, before, 1e-9) << "the freed tensor is still counted";
  EXPECT_NEAR(counters[3].value, before, 1e-9);
  EXPECT_NEAR(counters[4].value, before, 1e-9);
}

}  // namespace
}  // namespace moe
