// What moe_train and the benchmarks do when memory runs out mid-run: the sizes asked for do not
// fit the machine, a user error that no allocation can return (engine/memory/out_of_memory.h).
// ExitOnOutOfMemory makes it one line on stderr, "<program>: <what ran out>; <advice>", and exit
// code 1, for the engine's allocators (device and pinned host memory) and for operator new (host
// memory). Install it once, after the command line is checked and before any work.
#pragma once

namespace moe {

// `program` and `advice` must outlive the process (string literals).
void ExitOnOutOfMemory(const char* program, const char* advice);

}  // namespace moe
