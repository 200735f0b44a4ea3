#include "apps/common/out_of_memory_exit.h"

#include <unistd.h>

#include <cstdio>
#include <new>
#include <string>

#include "engine/memory/out_of_memory.h"

namespace moe {
namespace {

const char* exit_program = "";
const char* exit_advice = "";

// One line and exit 1, without running exit-time code that could allocate again; allocates
// nothing itself (it also runs when operator new has failed).
[[noreturn]] void ExitOutOfMemory(const char* what) {
  fflush(stdout);
  fprintf(stderr, "%s: %s; %s\n", exit_program, what, exit_advice);
  fflush(stderr);
  _exit(1);
}

[[noreturn]] void AllocatorOutOfMemory(const std::string& line) { ExitOutOfMemory(line.c_str()); }

void HostOutOfMemory() { ExitOutOfMemory("out of host memory (an allocation failed)"); }

}  // namespace

void ExitOnOutOfMemory(const char* program, const char* advice) {
  exit_program = program;
  exit_advice = advice;
  SetOutOfMemoryHandler(&AllocatorOutOfMemory);
  std::set_new_handler(&HostOutOfMemory);
}

}  // namespace moe
