// --load, checked before any work (Trainer::Load then only restores): the path resolves to a
// checkpoint (engine/io/checkpoint.h) whose state.json parses; its model shape equals this run's,
// else one line naming each field that differs as its flag, with both values ("--load ckpt: the
// checkpoint's model differs in --hidden_size (checkpoint 64, this run 128)"); --train_steps is
// beyond the checkpoint's step, else the run would end having trained nothing; and --trace_steps
// lie after that step.
#pragma once

#include "apps/moe_train/run_flags.h"
#include "engine/core/status.h"

namespace moe {

Status CheckResume(const RunConfig& run);

}  // namespace moe
