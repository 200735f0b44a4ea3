// Stop signals: how a scheduler asks a run to end (SLURM sends SIGTERM at the time limit and
// SIGKILL after a grace period; `sbatch --signal` can send SIGUSR1 ahead of time; Ctrl-C is
// SIGINT). InstallStopSignalHandlers makes SIGTERM, SIGINT and SIGUSR1 request a stop instead of
// ending the process: the handler only records the first signal's number in a lock-free atomic
// (async-signal-safe), and the training loop reads StopSignalReceived between steps, finishes the
// step it is in, saves and exits (the app decides how; the engine never exits).
//
// A second stop signal, of any of the three, ends the process at once: the handler restores the
// default disposition and re-raises it, so the process dies of that signal (a shell reports
// 128 + N). Whatever was being written then is a temporary that a later save removes; published
// checkpoints are never half-written (engine/io/checkpoint.h).
//
// Handlers are process-wide and installed with SA_RESTART, so system calls of other threads that
// a signal interrupts are restarted rather than failing with EINTR.
#pragma once

#include <csignal>

namespace moe {

inline constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

void InstallStopSignalHandlers();

// The first stop signal received since InstallStopSignalHandlers (SIGTERM, SIGINT or SIGUSR1),
// or 0 if none.
int StopSignalReceived();

// "SIGTERM", "SIGINT" or "SIGUSR1": one of kStopSignals.
const char* StopSignalName(int signal);

}  // namespace moe
