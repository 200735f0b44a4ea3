// Benchmark inputs: normal values (mean 0, deviation `scale`) drawn on the host from `seed`, in
// order. The first min(numel, distinct) values are drawn and repeat through the tensor, so that
// multi-GB weights need not be drawn on the host in full. GEMM inputs must be random bits: on
// constant or zero inputs a GEMM draws less power and the GPU holds higher clocks than on real
// data.
#pragma once

#include <cstdint>

#include "engine/core/tensor.h"

namespace moe {

Tensor RandomTensor(const Shape& shape, DType dtype, Device device, float scale, uint32_t seed,
                    int64_t distinct);

}  // namespace moe
