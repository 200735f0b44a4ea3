// The one table of flags that only mean something together with another feature (offload knobs
// without --offload_modules, pipeline knobs without a pipeline, data knobs with the synthetic
// data, checkpoint knobs without --save, trace knobs without --trace_file, the dry run's knobs
// without --dry_run, ...). A flag that the
// user set (on the command line or in a flagfile) while its feature is off would be silently
// unused: CheckFlagRules refuses it in one line, "--offload_fraction=0.5 needs --offload_modules:
// without it nothing is offloaded". Every row is tested (tests/apps/moe_train_cli_test.cc).
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace moe {

// What the rules look at besides the flags.
struct FlagRuleContext {
  int world_size = 1;
  bool cuda = false;     // --device resolves to a GPU
  bool dry_run = false;  // --dry_run (dry_run.h)
};

struct FlagRule {
  const char* flag;
  // True when the flag is in use; nullptr: when the user set it (not gflags' default).
  bool (*in_use)(const FlagRuleContext&);
  const char* needs;  // the feature, in words, e.g. "--offload_modules"
  bool (*feature_on)(const FlagRuleContext&);
  const char* why;  // what happens without it
};

const std::vector<FlagRule>& FlagRules();

// The first rule broken, as one line.
Status CheckFlagRules(const FlagRuleContext& context);

}  // namespace moe
