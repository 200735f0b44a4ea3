#include "engine/runtime/stop_signal.h"

#include <signal.h>

#include <atomic>

#include <glog/logging.h>

namespace moe {
namespace {

std::atomic<int> first_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler must not take a lock");

void OnStopSignal(int signal) {
  int none = 0;
  if (first_signal.compare_exchange_strong(none, signal)) return;
  // The second one: die of it now (the default action of all three ends the process).
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  raise(signal);
}

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction action = {};
  action.sa_handler = &OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int signal : kStopSignals) {
    CHECK_EQ(sigaction(signal, &action, nullptr), 0) << "sigaction " << signal;
  }
}

int StopSignalReceived() { return first_signal.load(); }

const char* StopSignalName(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
  }
  LOG(FATAL) << "not a stop signal: " << signal;
}

}  // namespace moe
