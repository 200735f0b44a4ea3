// The router's gate, one kernel each way, behind ops::RouterGateForward and RouterGateBackward
// (engine/kernels/ops.h, which checks the operands and runs the separate ops where these
// decline). Runs on the device's compute stream.
#pragma once

#include "engine/core/tensor.h"

namespace moe::cuda {

// Each launches its kernel and returns true, or returns false having done nothing where a row
// does not fit a warp: more than 256 experts (columns) or more than 32 picks (k).
bool TryRouterGateForward(const Tensor& logits, bool renormalize, const Tensor& probs,
                          const Tensor& values, const Tensor& weights, const Tensor& indices);
bool TryRouterGateBackward(const Tensor& dweights, const Tensor& values, const Tensor& indices,
                           const Tensor& probs, const Tensor& offsets, float balance_grad,
                           bool renormalize, const Tensor& dlogits);

}  // namespace moe::cuda
