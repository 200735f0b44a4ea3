// CPU streams and events: inline compute, worker copy streams, waits, and the latency knob.
#include "engine/runtime/cpu_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "tests/testing/copy_latency.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

TEST(CpuStreamTest, InlineStreamCopiesBeforeReturning) {
  CpuStream stream(CpuStream::Mode::kInline);
  testing::LatencyKnob knob(std::chrono::milliseconds(500));  // never applies to the inline stream
  int src = 42, dst = 0;
  const auto start = Clock::now();
  stream.CopyAsync(&dst, &src, sizeof(int));
  EXPECT_EQ(dst, 42);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(100));
}

TEST(CpuStreamTest, WorkerCopyIsAsynchronousAndLatencyKnobDelaysIt) {
  CpuStream worker(CpuStream::Mode::kWorker);
  testing::LatencyKnob knob(std::chrono::milliseconds(100));
  std::vector<int> src(1024, 7), dst(1024, 0);
  const auto start = Clock::now();
  worker.CopyAsync(dst.data(), src.data(), src.size() * sizeof(int));
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(50)) << "CopyAsync blocked";
  auto event = worker.CreateEvent(false);
  event->Record(worker);
  EXPECT_FALSE(event->Query()) << "copy finished despite 100 ms latency";
  event->Synchronize();
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(dst[1023], 7);
}

TEST(CpuStreamTest, StreamWaitOrdersWorkAcrossStreams) {
  CpuStream first(CpuStream::Mode::kWorker);
  CpuStream second(CpuStream::Mode::kWorker);
  testing::LatencyKnob knob(std::chrono::milliseconds(100));
  int a = 1, b = 0, c = 0;
  first.CopyAsync(&b, &a, sizeof(int));  // b = 1 after 100 ms
  auto done = first.CreateEvent(false);
  done->Record(first);
  second.Wait(*done);
  second.CopyAsync(&c, &b, sizeof(int));  // must see b == 1
  second.Synchronize();
  EXPECT_EQ(c, 1);
}

TEST(CpuStreamTest, InlineWaitBlocksTheCaller) {
  CpuStream worker(CpuStream::Mode::kWorker);
  CpuStream compute(CpuStream::Mode::kInline);
  testing::LatencyKnob knob(std::chrono::milliseconds(100));
  int src = 5, dst = 0;
  worker.CopyAsync(&dst, &src, sizeof(int));
  auto event = worker.CreateEvent(false);
  event->Record(worker);
  compute.Wait(*event);
  EXPECT_EQ(dst, 5);
}

TEST(CpuStreamTest, WaitUsesTheRecordAtCallTime) {
  CpuStream worker(CpuStream::Mode::kWorker);
  CpuStream waiter(CpuStream::Mode::kWorker);
  auto event = worker.CreateEvent(false);
  EXPECT_TRUE(event->Query()) << "an unrecorded event counts as complete";
  event->Record(worker);
  waiter.Wait(*event);
  std::atomic<bool> ran{false};
  waiter.Enqueue([&ran] { ran = true; });  // a host task: the copy latency does not apply
  {
    testing::LatencyKnob knob(std::chrono::milliseconds(200));
    int src = 1, dst = 0;
    worker.CopyAsync(&dst, &src, sizeof(int));  // a later, slow copy
    event->Record(worker);                      // re-recorded after the Wait
    const auto start = Clock::now();
    waiter.Synchronize();  // needs only the first record
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(150));
    worker.Synchronize();
  }
  EXPECT_TRUE(ran);
}

TEST(CpuStreamTest, EventTimingMeasuresWorkerTime) {
  CpuStream worker(CpuStream::Mode::kWorker);
  testing::LatencyKnob knob(std::chrono::milliseconds(50));
  auto start = worker.CreateEvent(true);
  auto stop = worker.CreateEvent(true);
  int x = 0, y = 1;
  start->Record(worker);
  worker.CopyAsync(&x, &y, sizeof(int));
  stop->Record(worker);
  const float ms = stop->ElapsedMillisecondsSince(*start);
  EXPECT_GE(ms, 45.0f);
  EXPECT_LT(ms, 1000.0f);
}

}  // namespace
}  // namespace moe
