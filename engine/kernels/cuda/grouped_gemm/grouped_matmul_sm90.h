// The Hopper grouped GEMMs (grouped_gemm_sm90.cuh) behind the CUDA GroupedMatmul and
// GroupedMatmulWeightGrad (grouped_matmul.cu, which falls back to cuBLAS where they decline).
// Operands and contracts as in engine/kernels/op_declarations.inc; `offsets` is read on the
// device only, so nothing here waits for it. Runs on the device's compute stream. The plain
// products (TryGroupedMatmulSm90) keep a workspace per device for their split last wave (16.5 MiB
// on 132 SMs), allocated on first use outside the caching allocator, as cuBLAS's workspace is.
#pragma once

#include <span>

#include "engine/core/tensor.h"
#include "engine/kernels/ops.h"

namespace moe::cuda {

// Whether the kernels take calls on `device` with `dtype` operands and weights (or their
// gradient) of `weight_shape` (groups, r, c) in either orientation: a build for architecture 90,
// a compute capability 9.0 device, bf16, r and c multiples of 8, 1 <= groups <= sm90::kMaxGroups.
bool Sm90GroupedGemmTakes(Device device, DType dtype, const Shape& weight_shape);

// Each launches the kernel and returns true when it takes the call; otherwise (see above, and
// operands not 16-byte aligned or sizes of 2^31 and more) returns false having done nothing.
// The weight gradient's dw is f32 or bf16 (any other dtype: false).
bool TryGroupedMatmulSm90(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y,
                          bool transpose_w);
// The weight gradient takes every part or none, in launches of up to sm90::kMaxWeightGradParts
// parts (the first = or +=, the rest +=).
bool TryGroupedMatmulWeightGradSm90(std::span<const ops::GroupedRows> parts, const Tensor& dw,
                                    bool accumulate);
// ops::GroupedMatmulSwiglu's fc1 with SwiGLU (h = x w^T, a = swiglu(h) * scale) as one kernel;
// also false where f (a's columns) is no multiple of 8, or rows or k is 0.
bool TryGroupedMatmulSwigluSm90(const Tensor& x, const Tensor& w, const Tensor& offsets,
                                const Tensor& scale, const Tensor& h, const Tensor& a);
// ops::GroupedMatmulSwigluBackward's fc2 data gradient with the SwiGLU gradient as one kernel;
// false where GroupedMatmulSwiglu's kernel would decline (f = dh's columns / 2), where rows or k
// is 0, and where k (dy's columns, the product's reduction) is below kFusedSwigluBackwardMinK
// unless FuseSwigluBackwardAtAnyK(true): there the two ops are faster (each tile's mainloop, which
// grows with k, is too short to hide the SwiGLU gradient of the tile before it).
constexpr int64_t kFusedSwigluBackwardMinK = 4096;
bool TryGroupedMatmulSwigluBackwardSm90(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                        const Tensor& h, const Tensor& scale, const Tensor& dh,
                                        const Tensor& dscale);
// Whether TryGroupedMatmulSwigluBackwardSm90 also takes k below kFusedSwigluBackwardMinK (default
// false; tests set it to check the kernel at their small k).
void FuseSwigluBackwardAtAnyK(bool any_k);

}  // namespace moe::cuda
