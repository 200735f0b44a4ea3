#include "modules/fp8_expert_gemms.h"

#include <vector>

#include <glog/logging.h>

#include "engine/kernels/fp8_scaling.h"
#include "engine/kernels/ops.h"
#include "engine/runtime/step_timeline.h"

namespace moe {

namespace {

// The FP8 forms of grouped rows (rows, k) over `groups` groups: the column tiles with
// `columns`, the row tiles with `row_tiles` (undefined tensors otherwise).
struct Fp8Forms {
  Fp8Columns columns;
  Fp8Rows rows;
};
Fp8Forms AllocateForms(int64_t rows, int64_t k, int64_t groups, Device device, bool columns,
                       bool row_tiles) {
  Fp8Forms out;
  if (columns) {
    out.columns = {Tensor::Empty({k, Fp8ColumnTokens(groups, rows)}, DType::kE4M3, device),
                   Tensor::Empty({Fp8ColumnTileSlots(groups, rows), k}, DType::kF32, device), rows};
  }
  if (row_tiles) {
    out.rows = {Tensor::Empty({rows, k}, DType::kE4M3, device),
                Tensor::Empty({rows, Fp8Tiles(k)}, DType::kF32, device)};
  }
  return out;
}

}  // namespace

Fp8Columns QuantizeColumns(const PermutedRows& x, const Tensor& offsets, Fp8Rows* row_tiles) {
  const Fp8Forms f = AllocateForms(x.rows(), x.values.dim(1), offsets.numel() - 1,
                                   x.values.device(), /*columns=*/true, row_tiles != nullptr);
  ops::QuantizeColumnTiles(x.values, offsets, f.columns.q, f.columns.scales, f.rows.q,
                           f.rows.scales, x.index);
  if (row_tiles != nullptr) *row_tiles = f.rows;
  return f.columns;
}

Fp8Columns QuantizeSwiglu(const Tensor& h, const Tensor& scale, const Tensor& offsets,
                          Fp8Rows* row_tiles, bool columns) {
  const Fp8Forms f = AllocateForms(h.dim(0), h.dim(1) / 2, offsets.numel() - 1, h.device(), columns,
                                   row_tiles != nullptr);
  ops::SwigluForwardQuantized(h, scale, offsets, f.columns.q, f.columns.scales, f.rows.q,
                              f.rows.scales);
  if (row_tiles != nullptr) *row_tiles = f.rows;
  return f.columns;
}

Fp8Columns QuantizeSwigluGradient(const Tensor& da, const Tensor& h, const Tensor& scale,
                                  const Tensor& offsets, Fp8Rows& row_tiles, const Tensor& dscale) {
  const Fp8Forms f = AllocateForms(h.dim(0), h.dim(1), offsets.numel() - 1, h.device(),
                                   /*columns=*/true, /*row_tiles=*/true);
  ops::SwigluBackwardQuantized(da, h, scale, offsets, f.columns.q, f.columns.scales, f.rows.q,
                               f.rows.scales, dscale);
  row_tiles = f.rows;
  return f.columns;
}

void AddFp8WeightGrads(std::span<const Fp8WeightGradPart> parts, const Tensor& dw,
                       bool accumulate) {
  std::vector<ops::Fp8GroupedColumns> columns;
  for (const Fp8WeightGradPart& p : parts) {
    columns.push_back({p.dy.q, p.dy.scales, p.x.q, p.x.scales, p.offsets, p.dy.rows});
  }
  ops::Fp8GroupedMatmulWeightGrad(columns, dw, accumulate);
}

void Fp8ExpertWeights::Refresh(const Tensor& w, uint64_t values_version) {
  if (version_ == values_version) return;
  const TraceSpan span(w.device(), "fp8 weight quantisation");
  if (!w_.q.defined()) {
    const int64_t experts = w.dim(0), n = w.dim(1), k = w.dim(2);
    w_ = {Tensor::Empty({experts, n, k}, DType::kE4M3, w.device()),
          Tensor::Empty({experts, Fp8Tiles(n), Fp8Tiles(k)}, DType::kF32, w.device())};
    w_transposed_ = {Tensor::Empty({experts, k, n}, DType::kE4M3, w.device()),
                     Tensor::Empty({experts, Fp8Tiles(k), Fp8Tiles(n)}, DType::kF32, w.device())};
  }
  ops::QuantizeBlocks(w, w_.q, w_.scales, w_transposed_.q, w_transposed_.scales);
  version_ = values_version;
}

namespace {

Tensor Multiply(const Fp8Rows& x, const Fp8Rows& w, const Tensor& offsets, DType dtype) {
  Tensor y = Tensor::Empty({x.q.dim(0), w.q.dim(1)}, dtype, x.q.device());
  ops::Fp8GroupedMatmul(x.q, x.scales, w.q, w.scales, offsets, y);
  return y;
}

}  // namespace

Tensor Fp8ExpertWeights::Forward(const Fp8Rows& x, const Tensor& offsets, DType dtype) const {
  CHECK(version_.has_value()) << "FP8 expert weights used before Refresh";
  return Multiply(x, w_, offsets, dtype);
}

Tensor Fp8ExpertWeights::InputGrad(const Fp8Rows& dy, const Tensor& offsets, DType dtype) const {
  CHECK(version_.has_value()) << "FP8 expert weights used before Refresh";
  return Multiply(dy, w_transposed_, offsets, dtype);
}

}  // namespace moe
