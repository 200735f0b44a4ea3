#include "engine/core/check.h"

#include <unistd.h>

#include <atomic>

namespace moe {
namespace {
std::atomic<int> g_rank{-1};
}  // namespace

void SetProcessRank(int rank) { g_rank = rank; }
int ProcessRank() { return g_rank; }

const std::string& HostName() {
  static const std::string name = [] {
    char buffer[256] = {};
    gethostname(buffer, sizeof(buffer) - 1);
    return std::string(buffer);
  }();
  return name;
}

void FailCall(const char* library, const char* call, const char* file, int line,
              const std::string& error) {
  LOG(FATAL) << library << " call failed: " << call << " -> " << error << " at " << file << ":"
             << line << " (rank " << ProcessRank() << ", host " << HostName() << ")";
  __builtin_unreachable();
}

}  // namespace moe
