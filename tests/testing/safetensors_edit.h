// Edits a safetensors file's bytes in place, bypassing the project's writer, to make the damaged
// checkpoints that tests feed to moe_train.
#pragma once

#include <string>

namespace moe::testing {

// Writes `value` over every element of the f32 tensors of `file` whose names contain `part`;
// returns how many tensors it changed (0 if none matched).
int OverwriteF32Tensors(const std::string& file, const std::string& part, float value);

}  // namespace moe::testing
