// The CUDA backend of the ops API: bf16 or f32 storage, fp32 accumulation, cuBLAS for matmuls.
// Every op runs on the tensor's device compute stream. Contracts:
// engine/kernels/op_declarations.inc.
#pragma once

#include "engine/kernels/ops.h"

namespace moe::cuda {
using ops::AdamWConfig;
using ops::AdamWTensors;
using ops::Fp8GroupedColumns;
using ops::GroupedRows;
#include "engine/kernels/op_declarations.inc"
}  // namespace moe::cuda
