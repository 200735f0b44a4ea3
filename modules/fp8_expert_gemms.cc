#include "modules/fp8_expert_gemms.h"

#include <vector>

#include <glog/logging.h>

#include "engine/kernels/fp8_scaling.h"
#include "engine/kernels/ops.h"

namespace moe {

Fp8Rows QuantizeRows(const Tensor& x) {
  Fp8Rows out{Tensor::Empty(x.shape(), DType::kE4M3, x.device()),
              Tensor::Empty({x.dim(0), Fp8Tiles(x.dim(1))}, DType::kF32, x.device())};
  ops::QuantizeRowTiles(x, out.q, out.scales);
  return out;
}

Fp8Columns QuantizeColumns(const Tensor& x, const Tensor& offsets, Fp8Rows* row_tiles) {
  const int64_t n = x.dim(0), k = x.dim(1), groups = offsets.numel() - 1;
  Fp8Columns out{Tensor::Empty({k, Fp8PaddedRows(n)}, DType::kE4M3, x.device()),
                 Tensor::Empty({Fp8ColumnTileSlots(groups, n), k}, DType::kF32, x.device()), n};
  if (row_tiles == nullptr) {
    ops::QuantizeColumnTiles(x, offsets, out.q, out.scales);
    return out;
  }
  *row_tiles = {Tensor::Empty(x.shape(), DType::kE4M3, x.device()),
                Tensor::Empty({n, Fp8Tiles(k)}, DType::kF32, x.device())};
  ops::QuantizeColumnTiles(x, offsets, out.q, out.scales, row_tiles->q, row_tiles->scales);
  return out;
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
  if (!w_.q.defined()) {
    w_ = {
        Tensor::Empty(w.shape(), DType::kE4M3, w.device()),
        Tensor::Empty({w.dim(0), Fp8Tiles(w.dim(1)), Fp8Tiles(w.dim(2))}, DType::kF32, w.device())};
  }
  ops::QuantizeBlocks(w, w_.q, w_.scales);
  w_source_ = w;
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

Tensor Fp8ExpertWeights::InputGrad(const Fp8Rows& dy, const Tensor& offsets, DType dtype) {
  CHECK(version_.has_value()) << "FP8 expert weights used before Refresh";
  if (transposed_version_ != version_) {
    const Tensor& w = w_source_;
    const int64_t experts = w.dim(0), n = w.dim(1), k = w.dim(2);
    if (!w_transposed_.q.defined()) {
      w_transposed_ = {Tensor::Empty({experts, k, n}, DType::kE4M3, w.device()),
                       Tensor::Empty({experts, Fp8Tiles(k), Fp8Tiles(n)}, DType::kF32, w.device())};
    }
    ops::QuantizeBlocks(w, w_transposed_.q, w_transposed_.scales, /*transposed=*/true);
    transposed_version_ = version_;
  }
  return Multiply(dy, w_transposed_, offsets, dtype);
}

}  // namespace moe
