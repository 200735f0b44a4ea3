// The table of moe_train's own flags: the help group of each (README.md's "Flags that matter")
// and, for every numeric flag, its accepted range. CheckFlagRanges enforces the ranges; --help
// prints them beside each flag, so the range is documented where the flag is. A bound that
// depends on another flag (--moe_router_topk <= --num_experts) is documented here as `relation`
// and enforced with that flag's other checks (run_flags.cc).
//
// Values are printed so that they can be passed back: integers in full, doubles in their
// shortest round-trip form (FlagValueText).
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace moe {

struct FlagRow {
  const char* name;
  const char* group;  // one of FlagGroups()
  // Numeric flags only (is_numeric): the range [min, max]; open at min when min_open, at max when
  // max_open.
  bool is_numeric = false;
  double min = 0;
  double max = 0;
  bool min_open = false;
  bool max_open = false;
  const char* relation = "";  // a further bound, checked elsewhere, e.g. "<= --num_experts"
};

// In README order: model, expert layer, training, parallelism, data, eval, checkpoints, seeing a
// step, memory budget, offloading, recompute, dry run.
const std::vector<std::string>& FlagGroups();
const std::vector<FlagRow>& FlagTable();

// Every numeric flag of the table within its range (NaN and infinities never are), else one
// line: "--seed=-1 must be in [0, 9223372036854775807]".
Status CheckFlagRanges();

// A flag's current value as it can be passed back: doubles in the shortest form that parses to
// the same value (0.003, not 0.0030000000000000001), everything else as gflags holds it.
std::string FlagValueText(const std::string& name);
// The shortest %g text that parses back to `value` ("0.003", "1e+20", "inf").
std::string ShortestDouble(double value);

// The help: the project's flags by group with default, range and description (`short_form`:
// only the names per group), then a line pointing at --helpfull for the libraries' flags.
std::string FlagHelp(const std::string& program, bool short_form);

}  // namespace moe
