// The median over `iters` runs of body's device time on the compute stream (timing events), with
// or without a warm-up run first.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "engine/runtime/device_context.h"

namespace moe {

inline double MedianMs(Device device, int iters, const std::function<void()>& body) {
  Stream& stream = DeviceContext::Get(device).compute_stream();
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    auto start = stream.CreateEvent(true), stop = stream.CreateEvent(true);
    start->Record(stream);
    body();
    stop->Record(stream);
    times.push_back(stop->ElapsedMillisecondsSince(*start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One untimed run of body (a warm-up), then MedianMs.
inline double WarmedMedianMs(Device device, int iters, const std::function<void()>& body) {
  body();
  return MedianMs(device, iters, body);
}

}  // namespace moe
