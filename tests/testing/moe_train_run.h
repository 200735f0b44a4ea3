// For the tests that run the moe_train binary of their target (MOE_TRAIN_BINARY, defined by
// tests/CMakeLists.txt for tests/apps): one run, a command line it must refuse and how a refusal
// looks, and the step records of a --metrics_file.
#pragma once

#include <algorithm>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// A refusal before any work: exit code 2 and one line, holding `message`.
inline void ExpectRefusedInOneLine(const CommandResult& r, const std::string& message) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "work started: " << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// The training-step records of a --metrics_file (evaluation records left out), in order.
inline std::vector<nlohmann::json> StepRecords(const std::string& metrics_path) {
  std::vector<nlohmann::json> out;
  std::ifstream file(metrics_path);
  std::string line;
  while (std::getline(file, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) out.push_back(std::move(record));
  }
  return out;
}

}  // namespace moe::testing
