// A bias-free linear map, as free functions: modules decide what to save.
//   x (rows, in); weight (out, in) (PyTorch layout); y (rows, out) = x weight^T.
//   Backward: dx (=, or += when accumulate_dx) = dy weight; dweight (f32) = or += dy^T x
//   (for a Parameter, as BeginGradWrite says).
#pragma once

#include "engine/autograd/parameters.h"
#include "engine/core/tensor.h"

namespace moe {

Tensor LinearForward(const Tensor& x, const Parameter& weight);
// Into an existing output (e.g. f32 router logits from bf16 inputs).
void LinearForwardInto(const Tensor& x, const Tensor& weight, const Tensor& y);
void LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dweight,
                    const Tensor& dx, bool accumulate_dx, bool accumulate_dweight);
// The same for a Parameter, into an existing dx or returning a new one.
void LinearBackward(const Tensor& dy, const Tensor& x, Parameter& weight, const Tensor& dx,
                    bool accumulate_dx);
Tensor LinearBackward(const Tensor& dy, const Tensor& x, Parameter& weight);

}  // namespace moe
