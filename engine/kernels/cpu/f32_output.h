// An op output that may be bf16 on the CPU backend, which computes in f32: gradients
// (OptimizerDTypes::grad) are the only such outputs. The op writes f32() and then calls Commit():
// for an f32 output f32() is the output itself and Commit() does nothing; for a bf16 one f32() is
// an f32 copy (holding the output's values when the op reads them, i.e. adds to them), which
// Commit() rounds to nearest even into the output. So a bf16 gradient is rounded once per op, as
// the CUDA kernels do.
#pragma once

#include "engine/core/tensor.h"

namespace moe::cpu {

class F32Output {
 public:
  // `read`: the op reads the output's values (+=, beta != 0).
  F32Output(const Tensor& out, bool read);
  const Tensor& f32() const { return f32_; }
  void Commit() const;

 private:
  Tensor out_;
  Tensor f32_;
};

}  // namespace moe::cpu
