// The process-wide out-of-memory report of the engine's allocators (caching_allocator.h for
// device memory, pinned_host_pool.h for pinned host memory). Running out is a user error (a run
// too large for the machine), but an allocation has no way to return one: every op allocates,
// and no caller can recover mid-step. So an allocator that fails calls ReportOutOfMemory with one
// line ("out of cuda:0 memory allocating 2147483648 bytes: ..."), outside its locks. The library
// never exits: an app installs a handler that prints the line and exits non-zero (moe_train and
// the benchmarks do, apps/common/out_of_memory_exit.h). Without a handler (tests), or if it
// returns, the report is fatal, as for any other broken invariant.
#pragma once

#include <string>

namespace moe {

// Called with the line; must not return. nullptr removes the handler. Returns the previous one.
using OutOfMemoryHandler = void (*)(const std::string& message);
OutOfMemoryHandler SetOutOfMemoryHandler(OutOfMemoryHandler handler);

// Calls the handler, then (if there is none, or it returned) fails fatally with the line.
[[noreturn]] void ReportOutOfMemory(const std::string& message);

}  // namespace moe
