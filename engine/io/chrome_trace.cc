#include "engine/io/chrome_trace.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

namespace moe {
namespace {

int Tid(TraceTrack track) { return static_cast<int>(track) + 1; }

}  // namespace

StatusOr<std::unique_ptr<ChromeTraceWriter>> ChromeTraceWriter::Create(const std::string& path,
                                                                       int rank) {
  std::ofstream file(path, std::ios::trunc);
  if (!file) return InvalidArgument("--trace_file " + path + ": cannot open for writing");
  return std::unique_ptr<ChromeTraceWriter>(new ChromeTraceWriter(std::move(file), rank));
}

ChromeTraceWriter::ChromeTraceWriter(std::ofstream file, int rank)
    : file_(std::move(file)), rank_(rank) {
  file_ << kChromeTraceStart << "\n";
  Write(nlohmann::json{{"name", "process_name"},
                       {"ph", "M"},
                       {"pid", rank_},
                       {"args", {{"name", "rank " + std::to_string(rank_)}}}}
            .dump());
  for (int t = 0; t < kNumTraceTracks; ++t) {
    const auto track = static_cast<TraceTrack>(t);
    Write(nlohmann::json{{"name", "thread_name"},
                         {"ph", "M"},
                         {"pid", rank_},
                         {"tid", Tid(track)},
                         {"args", {{"name", TraceTrackName(track)}}}}
              .dump());
    Write(nlohmann::json{{"name", "thread_sort_index"},
                         {"ph", "M"},
                         {"pid", rank_},
                         {"tid", Tid(track)},
                         {"args", {{"sort_index", t}}}}
              .dump());
  }
}

ChromeTraceWriter::~ChromeTraceWriter() { Close(); }

void ChromeTraceWriter::Write(const std::string& json) {
  file_ << (first_ ? "" : ",\n") << json;
  first_ = false;
}

void ChromeTraceWriter::AddStep(int64_t step, const std::vector<TraceEvent>& events) {
  const nlohmann::json args = {{"step", step}};
  std::map<int64_t, std::vector<const TraceEvent*>> flows;
  for (const TraceEvent& e : events) {
    nlohmann::json out = {{"name", e.name}, {"pid", rank_}, {"ts", e.start_us}, {"args", args}};
    switch (e.kind) {
      case TraceEvent::Kind::kSpan:
        out["ph"] = "X";
        out["tid"] = Tid(e.track);
        out["cat"] = TraceTrackName(e.track);
        out["dur"] = std::max(0.0, e.end_us - e.start_us);
        break;
      case TraceEvent::Kind::kInstant:
        out["ph"] = "i";
        out["s"] = "t";
        out["tid"] = Tid(e.track);
        out["cat"] = TraceTrackName(e.track);
        break;
      case TraceEvent::Kind::kCounter:
        out["ph"] = "C";
        out["args"] = {{"allocated MiB", e.value}};
        break;
    }
    Write(out.dump());
    if (e.flow >= 0) flows[e.flow].push_back(&e);
  }
  for (auto& [id, members] : flows) {
    if (members.size() < 2) continue;
    std::stable_sort(members.begin(), members.end(), [](const TraceEvent* a, const TraceEvent* b) {
      return a->start_us < b->start_us;
    });
    for (size_t i = 0; i < members.size(); ++i) {
      const TraceEvent& e = *members[i];
      nlohmann::json out = {
          {"name", members[0]->name}, {"cat", "flow"},    {"id", id},    {"pid", rank_},
          {"tid", Tid(e.track)},      {"ts", e.start_us}, {"args", args}};
      out["ph"] = i == 0 ? "s" : (i + 1 == members.size() ? "f" : "t");
      if (i + 1 == members.size()) out["bp"] = "e";
      Write(out.dump());
    }
  }
  file_.flush();
}

void ChromeTraceWriter::Close() {
  if (closed_) return;
  closed_ = true;
  file_ << "\n]}\n";
  file_.close();
}

}  // namespace moe
