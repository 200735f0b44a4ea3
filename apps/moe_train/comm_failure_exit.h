// What moe_train does when a communicator fails mid-run (a collective or transfer that has not
// finished after --distributed_timeout_minutes, or a backend error: comm_watchdog.h): the job
// cannot go on, and waiting longer would only hang it. ExitOnCommFailure makes the failure one
// line on stderr from the rank that reports it, "moe_train: step 7: communicator ... timed out:
// AllReduceSum of f32[4] (16 bytes) has not finished after ...; rank 1 did not arrive (rank 0,
// host node3)", and exit code 1, not an abort with a stack trace. Under mpirun that exit ends
// every other rank. Install it once, before the first communicator exists.
#pragma once

#include <cstdint>

namespace moe {

// `program` must outlive the process (a string literal).
void ExitOnCommFailure(const char* program);

// The step the run is in, for the line: `step` is being trained, or was the last one trained
// while the run evaluates, saves or stops (0: before the first step).
void SetCommFailureStep(int64_t step);

}  // namespace moe
