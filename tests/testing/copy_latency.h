// The CPU backend's test-only copy-stream latency (SetCpuCopyLatencyForTesting) for one scope.
#pragma once

#include <chrono>

#include "engine/core/stream.h"

namespace moe::testing {

class LatencyKnob {
 public:
  explicit LatencyKnob(std::chrono::microseconds latency) { SetCpuCopyLatencyForTesting(latency); }
  ~LatencyKnob() { SetCpuCopyLatencyForTesting(std::chrono::microseconds(0)); }
  LatencyKnob(const LatencyKnob&) = delete;
  LatencyKnob& operator=(const LatencyKnob&) = delete;
};

}  // namespace moe::testing
