#include "modules/fp8_expert_gemms.h"

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

Tensor Dequantized(const Fp8Rows& x, DType dtype) {
  Tensor out = Tensor::Empty(x.q.shape(), dtype, x.q.device());
  ops::DequantizeRowTiles(x.q, x.scales, out);
  return out;
}

void Fp8ExpertWeights::Refresh(const Tensor& w, uint64_t values_version) {
  if (version_ == values_version) return;
  const int64_t experts = w.dim(0), n = w.dim(1), k = w.dim(2);
  if (!w_.q.defined()) {
    w_ = {Tensor::Empty(w.shape(), DType::kE4M3, w.device()),
          Tensor::Empty({experts, Fp8Tiles(n), Fp8Tiles(k)}, DType::kF32, w.device())};
    w_transposed_ = {Tensor::Empty({experts, k, n}, DType::kE4M3, w.device()),
                     Tensor::Empty({experts, Fp8Tiles(k), Fp8Tiles(n)}, DType::kF32, w.device())};
  }
  ops::QuantizeBlocks(w, w_.q, w_.scales);
  ops::QuantizeBlocks(w, w_transposed_.q, w_transposed_.scales, /*transposed=*/true);
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
