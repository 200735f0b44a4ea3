// The load-balancing loss's gradient (op_declarations.inc, LoadBalancingLossBackward), shared by
// its kernel (moe_router.cu) and the router gate's backward (router_gate.cu).
#pragma once

#include <cstdint>

namespace moe::cuda {

// d(loss)/d(probs[t, e]) for every token t: grad * experts * count_e / (tokens^2 * topk), in
// double, rounded to float.
__device__ __forceinline__ float LoadBalancingGrad(float grad, int64_t experts, int64_t count,
                                                   int64_t tokens, int64_t topk) {
  return static_cast<float>(static_cast<double>(grad) * experts * count /
                            (static_cast<double>(tokens) * tokens * topk));
}

}  // namespace moe::cuda
