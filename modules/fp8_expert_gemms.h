// The blockwise FP8 recipe of the expert GEMMs (--fp8_recipe=blockwise; DeepSeek-V3's, Megatron-
// LM's name): the pieces the fused grouped MLP (fused_grouped_mlp.h) runs its GEMMs with.
//   Activations and gradients: e4m3 in 1 x 128 tiles along the contracted dimension, f32 scales
//   (ops::QuantizeRowTiles); weights: e4m3 in 128 x 128 blocks (ops::QuantizeBlocks), once per
//   optimizer step in both orientations (forward: w; input gradients: w transposed, so both GEMM
//   operands are K-major); ops::Fp8GroupedMatmul promotes the partial sums into f32 every 128 of
//   the contracted dimension. Outputs in the activations' dtype.
// Fp8ExpertWeights caches one stacked weight's quantised forms: Refresh() quantises them when the
// parameter set's values_version() moved since (the optimizer's update, a checkpoint loaded), so
// every micro-batch of a step and every forward between steps (evaluation) reuses one
// quantisation. Bytes held: 2 per element (the two orientations) plus their f32 scales.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/core/tensor.h"

namespace moe {

// Rows (rows, k) of an activation or gradient in e4m3, scales (rows, tiles(k)) f32.
struct Fp8Rows {
  Tensor q;
  Tensor scales;
};

// x (rows, k) quantised in 1 x 128 tiles.
Fp8Rows QuantizeRows(const Tensor& x);
// The rows back in `dtype` (each e4m3 value times its tile's scale, rounded to dtype).
Tensor Dequantized(const Fp8Rows& x, DType dtype);

class Fp8ExpertWeights {
 public:
  // Quantises w (experts, n, k) unless this holds its quantisation at `values_version`.
  void Refresh(const Tensor& w, uint64_t values_version);
  // group g's rows of x times w_g^T: (rows, n) in `dtype`.
  Tensor Forward(const Fp8Rows& x, const Tensor& offsets, DType dtype) const;
  // group g's rows of dy (rows, n) times w_g: (rows, k) in `dtype`.
  Tensor InputGrad(const Fp8Rows& dy, const Tensor& offsets, DType dtype) const;

 private:
  Fp8Rows w_, w_transposed_;         // (experts, n, k) and (experts, k, n), scales likewise
  std::optional<uint64_t> version_;  // the values_version they hold (none: not yet quantised)
};

}  // namespace moe
