// The blockwise FP8 recipe of the expert GEMMs (--fp8_recipe=blockwise; DeepSeek-V3's, Megatron-
// LM's name): the pieces the fused grouped MLP (fused_grouped_mlp.h) runs its GEMMs with.
//   Activations and gradients: e4m3 in 1 x 128 tiles along the contracted dimension, f32 scales
//   (row tiles, as ops::QuantizeRowTiles writes them); weights: e4m3 in 128 x 128 blocks
//   (ops::QuantizeBlocks), once per optimizer step in both orientations by one pass (forward: w;
//   input gradients: w transposed, so both GEMM operands are K-major); ops::Fp8GroupedMatmul
//   promotes the partial sums into f32 every 128 of the contracted dimension. Outputs in the
//   activations' dtype. Weight gradients: dy and x (or dh and a) e4m3 in 128 x 1 tiles along the
//   tokens within each expert's rows, written transposed (ops::QuantizeColumnTiles: the tokens,
//   which the weight gradient contracts, made contiguous, as the FP8 tensor cores need), by the
//   same pass that writes their row tiles; ops::Fp8GroupedMatmulWeightGrad promotes every 128
//   tokens.
// Fp8ExpertWeights caches one stacked weight's quantised forms, both made by one pass once per
// value of the parameter set's values_version() (it moves with the optimizer's update or a loaded
// checkpoint), when first used: every micro-batch of a step and every forward between steps
// (evaluation) reuses one quantisation. Bytes held: 2 per element (the two orientations) plus
// their f32 scales.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "engine/core/tensor.h"
#include "modules/grouped_mlp.h"

namespace moe {

// Rows (rows, k) of an activation or gradient in e4m3, scales (rows, tiles(k)) f32.
struct Fp8Rows {
  Tensor q;
  Tensor scales;
};

// Grouped rows x (rows, k) as the weight gradients take them (ops::QuantizeColumnTiles): q (k,
// Fp8ColumnTokens(groups, rows)) e4m3, each group's rows transposed from a multiple of 32 tokens;
// scales (Fp8ColumnTileSlots(groups, rows), k) f32, one per 128 rows of a group and column.
struct Fp8Columns {
  Tensor q;
  Tensor scales;
  int64_t rows = 0;
};

// The column tiles of x's rows (rows.values itself or its rows rows.index[r]) over `offsets`
// (groups + 1); with `row_tiles` given, their row tiles too, from the same pass over x.
Fp8Columns QuantizeColumns(const PermutedRows& x, const Tensor& offsets,
                           Fp8Rows* row_tiles = nullptr);
// The FP8 forms of a = SwigluForward(h, scale) (rows, f) over `offsets`, a never in memory
// (ops::SwigluForwardQuantized): its row tiles into `row_tiles` where given, and its column tiles,
// returned with `columns` (else an empty Fp8Columns).
Fp8Columns QuantizeSwiglu(const Tensor& h, const Tensor& scale, const Tensor& offsets,
                          Fp8Rows* row_tiles, bool columns);
// The FP8 forms of dh, SwigluBackward(da, h, scale)'s input gradient (rows, 2f), over `offsets`,
// dh never in memory (ops::SwigluBackwardQuantized): its row tiles into row_tiles, its column
// tiles returned; dscale (rows) f32 = as SwigluBackward's.
Fp8Columns QuantizeSwigluGradient(const Tensor& da, const Tensor& h, const Tensor& scale,
                                  const Tensor& offsets, Fp8Rows& row_tiles, const Tensor& dscale);
// dw (groups, n, k) (+)= the sum over the parts of dy_p^T · x_p per group (the parts' column tiles
// of dy (rows_p, n) and x (rows_p, k) over offsets_p): ops::Fp8GroupedMatmulWeightGrad.
struct Fp8WeightGradPart {
  Fp8Columns dy, x;
  Tensor offsets;
};
void AddFp8WeightGrads(std::span<const Fp8WeightGradPart> parts, const Tensor& dw, bool accumulate);

class Fp8ExpertWeights {
 public:
  // Quantises w (experts, n, k) in both orientations unless this holds its quantisation at
  // `values_version`. w's values must not change until the version does.
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
