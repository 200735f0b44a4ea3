// CPU Fp8GroupedMatmul and Fp8GroupedMatmulWeightGrad (contracts: engine/kernels/
// op_declarations.inc): the reference of the FP8 grouped GEMMs, in the contracts' order of
// operations: per output element, f32 partial sums over 128-element tiles of the contracted
// dimension, each scaled by its two tiles' scales and added into an f32 accumulator with one fma.
// Plain loops over the operands decoded to f32 (exactly).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/float8.h"
#include "engine/kernels/cpu/cpu_ops.h"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cpu {
namespace {

std::vector<float> Decoded(const Tensor& q) {
  std::vector<float> out;
  out.reserve(q.numel());
  for (const Float8E4M3 v : q.values<Float8E4M3>()) out.push_back(E4M3ToFloat(v));
  return out;
}

}  // namespace

void Fp8GroupedMatmul(const Tensor& xq, const Tensor& x_scales, const Tensor& wq,
                      const Tensor& w_scales, const Tensor& offsets, const Tensor& y) {
  const int64_t contracted = xq.dim(1), n = y.dim(1), groups = wq.dim(0);
  const Fp8TiledMatrices x_tiles = Fp8RowTiles(xq.dim(0), contracted);
  const Fp8TiledMatrices w_blocks = Fp8Blocks(groups, wq.dim(1), wq.dim(2));
  const std::vector<float> x = Decoded(xq), w = Decoded(wq);
  const float* xs = x_scales.data<float>();
  const std::span<const int32_t> rows = offsets.values<int32_t>();
  DispatchStorage(y.dtype(), [&]<typename T>(StorageTag<T>) {
    T* out = y.data<T>();
    for (int64_t g = 0; g < groups; ++g) {
      const float* wg = w.data() + g * w_blocks.elements();
      const float* ws = w_scales.data<float>() + g * w_blocks.tiles();
      for (int64_t r = rows[g]; r < rows[g + 1]; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          float acc = 0.0f;
          for (int64_t begin = 0; begin < contracted; begin += kFp8TileSize) {
            float partial = 0.0f;  // exact products of e4m3 values, summed in f32
            const int64_t end = std::min(contracted, begin + kFp8TileSize);
            for (int64_t i = begin; i < end; ++i)
              partial += x[r * contracted + i] * wg[j * contracted + i];
            acc = std::fma(partial, xs[x_tiles.TileOf(r, begin)] * ws[w_blocks.TileOf(j, begin)],
                           acc);
          }
          out[r * n + j] = FromFloat<T>(acc);
        }
      }
    }
  });
}

void Fp8GroupedMatmulWeightGrad(std::span<const Fp8GroupedColumns> parts, const Tensor& dw,
                                bool accumulate) {
  const int64_t groups = dw.dim(0), n = dw.dim(1), k = dw.dim(2);
  std::vector<std::vector<float>> dys, xs;
  for (const Fp8GroupedColumns& part : parts) {
    dys.push_back(Decoded(part.dy_q));
    xs.push_back(Decoded(part.x_q));
  }
  std::vector<float> acc(n * k);
  for (int64_t g = 0; g < groups; ++g) {
    std::ranges::fill(acc, 0.0f);
    bool has_rows = false;
    for (size_t p = 0; p < parts.size(); ++p) {
      const Fp8GroupedColumns& part = parts[p];
      const std::vector<float>&dy = dys[p], &x = xs[p];
      const int64_t tokens = part.dy_q.dim(1);
      const std::span<const int32_t> bounds = part.offsets.values<int32_t>();
      has_rows = has_rows || bounds[g] < bounds[g + 1];
      for (int64_t t = 0; t < Fp8ColumnTileCount(bounds[g], bounds[g + 1]); ++t) {
        const auto [r0, r1] = Fp8ColumnTileRows(bounds[g], bounds[g + 1], t);
        const int64_t slot = Fp8ColumnTileSlot(g, bounds[g], t);
        const float* dy_scales = part.dy_scales.data<float>() + slot * n;
        const float* x_scales = part.x_scales.data<float>() + slot * k;
        // The tile's rows as tokens of the transposed rows.
        const int64_t first = Fp8ColumnToken(g, bounds[g], r0), last = first + r1 - r0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < k; ++j) {
            float partial = 0.0f;  // exact products of e4m3 values, summed in f32
            for (int64_t r = first; r < last; ++r) {
              partial += dy[i * tokens + r] * x[j * tokens + r];
            }
            acc[i * k + j] = std::fma(partial, dy_scales[i] * x_scales[j], acc[i * k + j]);
          }
        }
      }
    }
    if (accumulate && !has_rows) continue;
    DispatchStorage(dw.dtype(), [&]<typename T>(StorageTag<T>) {
      T* out = dw.data<T>() + g * n * k;
      for (int64_t e = 0; e < n * k; ++e) {
        out[e] = FromFloat<T>(accumulate ? ToFloat(out[e]) + acc[e] : acc[e]);
      }
    });
  }
}

}  // namespace moe::cpu
