#include "engine/kernels/cpu/f32_output.h"

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

F32Output::F32Output(const Tensor& out, bool read) : out_(out), f32_(out) {
  if (out.dtype() == DType::kF32) return;
  f32_ = Tensor::Empty(out.shape(), DType::kF32, out.device());
  if (read) Cast(out, f32_);
}

void F32Output::Commit() const {
  if (out_.dtype() != DType::kF32) Cast(f32_, out_);
}

}  // namespace moe::cpu
