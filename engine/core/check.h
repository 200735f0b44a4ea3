// CHECK (from glog) for programmer errors, and the call-check family for CUDA/cuBLAS/NCCL/MPI:
// a failing call is logged with the call text, file:line, rank and host, then the process aborts.
// The backend-specific macros live next to their headers (cuda_check.h); they all funnel into
// FailCall so every failure reads the same.
#pragma once

#include <string>

#include <glog/logging.h>

namespace moe {

// The rank written in failure messages; set by the MPI bootstrap (-1 until then).
void SetProcessRank(int rank);
int ProcessRank();
const std::string& HostName();

[[noreturn]] void FailCall(const char* library, const char* call, const char* file, int line,
                           const std::string& error);

}  // namespace moe
