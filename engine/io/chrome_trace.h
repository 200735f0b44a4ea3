// ChromeTraceWriter: a StepTimeline's traced steps as a Chrome trace-event JSON file, which
// Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// Layout: one process per rank (pid = rank, named "rank <r>"), one thread per TraceTrack
// (tid = track + 1, named by TraceTrackName, in that order): spans are complete events ("X"),
// instants are thread-scoped instant events ("i"), the memory samples are a counter ("C",
// "device memory", args {"allocated MiB"}), and the members of one flow, in time order, are
// joined by flow events ("s", "t", "f"; category "flow", named by the first member). Every event
// but the counter carries args {"step"}.
// Times are the timeline's microseconds.
//
// The file is {"traceEvents": [...], "displayTimeUnit": "ms"}; events are appended as steps end
// and the closing brackets are written by Close() (or the destructor), so the file is valid JSON
// once the writer is closed. Create() fails (a Status naming the path) when it cannot be written.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/step_timeline.h"

namespace moe {

// The first bytes of every file the writer makes (a file that begins otherwise is not a trace).
inline constexpr std::string_view kChromeTraceStart =
    "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";

class ChromeTraceWriter {
 public:
  static StatusOr<std::unique_ptr<ChromeTraceWriter>> Create(const std::string& path, int rank);
  ~ChromeTraceWriter();

  void AddStep(int64_t step, const std::vector<TraceEvent>& events);
  void Close();

 private:
  ChromeTraceWriter(std::ofstream file, int rank);
  void Write(const std::string& json);

  std::ofstream file_;
  const int rank_;
  bool first_ = true;
  bool closed_ = false;
};

}  // namespace moe
