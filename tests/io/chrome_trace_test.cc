// ChromeTraceWriter: the file is JSON that trace viewers read: one process per rank with its five
// named tracks, spans as complete events with non-negative durations, instants, the memory
// counter, and each flow of two or more members as s/t/f events sharing its id in time order;
// events carry their step; Create fails with a Status for a path it cannot write.
#include "engine/io/chrome_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using nlohmann::json;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/chrome_trace_" + std::to_string(testing::TestSeed()) + "_" + name;
}

json ReadJson(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << path;
  return json::parse(file);  // throws (failing the test) if the file is not JSON
}

TraceEvent Span(TraceTrack track, const std::string& name, double start, double end,
                int64_t flow = -1) {
  TraceEvent e;
  e.kind = TraceEvent::Kind::kSpan;
  e.track = track;
  e.name = name;
  e.start_us = start;
  e.end_us = end;
  e.flow = flow;
  return e;
}

TraceEvent Instant(TraceTrack track, const std::string& name, double at, int64_t flow = -1) {
  TraceEvent e = Span(track, name, at, at, flow);
  e.kind = TraceEvent::Kind::kInstant;
  return e;
}

TraceEvent Counter(double at, double mib) {
  TraceEvent e = Span(TraceTrack::kCompute, "device memory", at, at);
  e.kind = TraceEvent::Kind::kCounter;
  e.value = mib;
  return e;
}

// Two steps of rank 3: step 5 with a flow of four members (given out of time order) and a
// one-member flow; step 6 with a span whose end rounds before its start.
std::string WriteSample(const std::string& name, bool close) {
  const std::string path = TempPath(name);
  StatusOr<std::unique_ptr<ChromeTraceWriter>> created = ChromeTraceWriter::Create(path, 3);
  EXPECT_TRUE(created.ok()) << created.status().message();
  std::unique_ptr<ChromeTraceWriter> writer = std::move(created).value();
  writer->AddStep(
      5, {Span(TraceTrack::kCompute, "step 5", 0, 1000),
          Span(TraceTrack::kCompute, "layer 0 attention forward", 10, 200),
          Span(TraceTrack::kHostToDevice, "layer 0 attn_norm reload", 600, 650, 7),
          Instant(TraceTrack::kCompute, "layer 0 attn_norm commit", 150, 7),
          Span(TraceTrack::kDeviceToHost, "layer 0 attn_norm offload copy", 160, 300, 7),
          Instant(TraceTrack::kCompute, "layer 0 attn_norm reloaded", 700, 7),
          Instant(TraceTrack::kCompute, "layer 1 mlp_norm commit", 400, 9),
          Span(TraceTrack::kPipelineComm, "SendAct(m0,c0)->r1", 250, 260),
          Span(TraceTrack::kDataParallelComm, "all-reduce rest", 800, 900), Counter(0, 1.5),
          Counter(1000, 2.25)});
  writer->AddStep(6, {Span(TraceTrack::kCompute, "step 6", 2000, 2999.999),
                      Span(TraceTrack::kCompute, "backward m0 c0", 2500, 2499.5)});
  if (close) writer->Close();
  return path;  // without Close, the destructor (here) closes the file
}

std::vector<json> EventsWithPh(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

TEST(ChromeTraceTest, MetadataNamesTheRankAndItsFiveTracks) {
  const std::string path = WriteSample("metadata.json", /*close=*/true);
  const json trace = ReadJson(path);
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  std::map<int, std::string> threads;
  int processes = 0;
  for (const json& e : EventsWithPh(trace, "M")) {
    EXPECT_EQ(e.at("pid"), 3) << e.dump();
    if (e.at("name") == "process_name") {
      ++processes;
      EXPECT_EQ(e.at("args").at("name"), "rank 3");
    } else if (e.at("name") == "thread_name") {
      EXPECT_TRUE(threads.emplace(e.at("tid").get<int>(), e.at("args").at("name")).second)
          << "thread named twice: " << e.dump();
    }
  }
  EXPECT_EQ(processes, 1);
  const std::map<int, std::string> want = {
      {1, "compute"},       {2, "offload D2H"},        {3, "offload H2D"},
      {4, "pipeline comm"}, {5, "data-parallel comm"}, {6, "expert-parallel comm"}};
  EXPECT_EQ(threads, want);
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, SpansInstantsAndCountersCarryTheirStepAndTrack) {
  const std::string path = WriteSample("events.json", /*close=*/true);
  const json trace = ReadJson(path);
  for (const json& e : trace.at("traceEvents")) EXPECT_EQ(e.at("pid"), 3) << e.dump();

  const std::vector<json> spans = EventsWithPh(trace, "X");
  ASSERT_EQ(spans.size(), 8u);
  std::map<std::string, json> by_name;
  for (const json& e : spans) {
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    by_name[e.at("name")] = e;
  }
  EXPECT_EQ(by_name.at("layer 0 attention forward").at("ts"), 10.0);
  EXPECT_EQ(by_name.at("layer 0 attention forward").at("dur"), 190.0);
  EXPECT_EQ(by_name.at("layer 0 attention forward").at("tid"), 1);
  EXPECT_EQ(by_name.at("layer 0 attention forward").at("args").at("step"), 5);
  EXPECT_EQ(by_name.at("layer 0 attn_norm offload copy").at("tid"), 2);
  EXPECT_EQ(by_name.at("layer 0 attn_norm reload").at("tid"), 3);
  EXPECT_EQ(by_name.at("SendAct(m0,c0)->r1").at("tid"), 4);
  EXPECT_EQ(by_name.at("all-reduce rest").at("tid"), 5);
  EXPECT_EQ(by_name.at("step 6").at("args").at("step"), 6);
  EXPECT_EQ(by_name.at("backward m0 c0").at("dur"), 0.0) << "an end before the start";

  const std::vector<json> instants = EventsWithPh(trace, "i");
  ASSERT_EQ(instants.size(), 3u);
  for (const json& e : instants) {
    EXPECT_EQ(e.at("tid"), 1) << e.dump();
    EXPECT_EQ(e.at("s"), "t") << e.dump();
    EXPECT_EQ(e.at("args").at("step"), 5) << e.dump();
  }

  const std::vector<json> counters = EventsWithPh(trace, "C");
  ASSERT_EQ(counters.size(), 2u);
  EXPECT_EQ(counters[0].at("name"), "device memory");
  EXPECT_EQ(counters[0].at("ts"), 0.0);
  EXPECT_EQ(counters[0].at("args").at("allocated MiB"), 1.5);
  EXPECT_EQ(counters[1].at("ts"), 1000.0);
  EXPECT_EQ(counters[1].at("args").at("allocated MiB"), 2.25);
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, FlowsOfTwoOrMoreMembersAreJoinedInTimeOrder) {
  const std::string path = WriteSample("flows.json", /*close=*/true);
  const json trace = ReadJson(path);
  std::vector<json> flow;
  for (const char* ph : {"s", "t", "f"}) {
    for (const json& e : EventsWithPh(trace, ph)) flow.push_back(e);
  }
  // Only flow 7: flow 9 has one member and draws no arrow.
  ASSERT_EQ(flow.size(), 4u);
  std::sort(flow.begin(), flow.end(),
            [](const json& a, const json& b) { return a.at("ts") < b.at("ts"); });
  const std::vector<std::string> phases = {"s", "t", "t", "f"};
  const std::vector<double> times = {150, 160, 600, 700};
  const std::vector<int> tids = {1, 2, 3, 1};
  for (size_t i = 0; i < flow.size(); ++i) {
    const json& e = flow[i];
    EXPECT_EQ(e.at("id"), 7) << e.dump();
    EXPECT_EQ(e.at("ph"), phases[i]) << e.dump();
    EXPECT_EQ(e.at("ts"), times[i]) << e.dump();
    EXPECT_EQ(e.at("tid"), tids[i]) << e.dump();
    EXPECT_EQ(e.at("cat"), "flow") << e.dump();
    EXPECT_EQ(e.at("name"), "layer 0 attn_norm commit") << "named by the first member";
    EXPECT_EQ(e.at("args").at("step"), 5) << e.dump();
  }
  EXPECT_EQ(flow.back().at("bp"), "e") << "the finish binds to its enclosing slice";
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, TheDestructorClosesTheFile) {
  const std::string path = WriteSample("unclosed.json", /*close=*/false);
  const json trace = ReadJson(path);
  EXPECT_EQ(EventsWithPh(trace, "X").size(), 8u);
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, AFileWithoutStepsIsValid) {
  const std::string path = TempPath("empty.json");
  {
    auto writer = ChromeTraceWriter::Create(path, 0);
    ASSERT_TRUE(writer.ok()) << writer.status().message();
    (*writer)->Close();
    (*writer)->Close();  // a second Close writes nothing more
  }
  const json trace = ReadJson(path);
  EXPECT_EQ(EventsWithPh(trace, "M").size(), 1u + 2u * kNumTraceTracks);
  EXPECT_TRUE(EventsWithPh(trace, "X").empty());
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, CreateFailsWithAStatusNamingThePath) {
  const std::string missing = "/nonexistent/dir/t.json";
  StatusOr<std::unique_ptr<ChromeTraceWriter>> created = ChromeTraceWriter::Create(missing, 0);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find(missing), std::string::npos)
      << created.status().message();

  const std::string dir = TempPath("a_directory");
  std::filesystem::create_directories(dir);
  created = ChromeTraceWriter::Create(dir, 0);
  ASSERT_FALSE(created.ok()) << "opened a directory for writing";
  EXPECT_NE(created.status().message().find(dir), std::string::npos) << created.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moe
