// For the tests that run the moe_train binary of their target (MOE_TRAIN_BINARY, defined by
// tests/CMakeLists.txt for tests/apps): one run, and a command line it must refuse.
#pragma once

#include <ostream>
#include <string>

#include "tests/testing/command.h"

namespace moe::testing {

// moe_train with `args`, as one process.
inline CommandResult RunMoeTrain(const std::string& args) {
  return RunCommand(std::string(MOE_TRAIN_BINARY) + " " + args);
}

// A command line moe_train must refuse, and what its one line must contain.
struct BadInput {
  std::string args;
  std::string message;
};

inline void PrintTo(const BadInput& input, std::ostream* os) { *os << input.args; }

}  // namespace moe::testing
