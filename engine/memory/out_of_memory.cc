#include "engine/memory/out_of_memory.h"

#include <atomic>

#include <glog/logging.h>

namespace moe {
namespace {

std::atomic<OutOfMemoryHandler> handler{nullptr};

}  // namespace

OutOfMemoryHandler SetOutOfMemoryHandler(OutOfMemoryHandler next) { return handler.exchange(next); }

void ReportOutOfMemory(const std::string& message) {
  if (OutOfMemoryHandler current = handler.load()) current(message);
  LOG(FATAL) << message;
  __builtin_unreachable();
}

}  // namespace moe
