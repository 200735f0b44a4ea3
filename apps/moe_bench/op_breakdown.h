// The fused grouped MLP's ops one at a time (fc1, SwiGLU, fc1 with SwiGLU as the path runs it,
// fc2 and their backward steps, fc2's data gradient with SwiGLU's backward as the path runs it,
// weight gradients both stored (=, a step's first micro-batch) and accumulated (+=)), at one layer
// shape with balanced routing (rows / experts rows per expert), each beside one dense GEMM of the
// same m, n, k: where the block's time goes and what fraction of the dense rate each grouped GEMM
// reaches. Inputs are random (random_tensor.h says why).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/dtype.h"

namespace moe {

struct ExpertShape {
  int64_t rows;  // routed rows = tokens x top-k
  int64_t hidden, experts, ffn;
};

struct OpTime {
  std::string op;
  double ms = 0;
  double gflop = 0;     // 0 for element-wise ops
  double dense_ms = 0;  // one dense GEMM of the same m, n, k (GEMMs only)
};

// Median of `iters` timed runs per op after `warmup` untimed ones; the weight gradients in
// `grad_dtype` (f32 or bf16).
std::vector<OpTime> TimeFusedMlpOps(const ExpertShape& shape, Device device, DType dtype,
                                    DType grad_dtype, int warmup, int iters);

}  // namespace moe
