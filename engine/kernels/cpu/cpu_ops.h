// The CPU backend of the ops API: fp32, Eigen and plain loops, deterministic. The reference every
// other backend is tested against. Contracts: engine/kernels/op_declarations.inc.
#pragma once

#include "engine/kernels/ops.h"

namespace moe::cpu {
using ops::AdamWConfig;
using ops::AdamWTensors;
using ops::Fp8GroupedColumns;
using ops::GroupedRows;
#include "engine/kernels/op_declarations.inc"
}  // namespace moe::cpu
