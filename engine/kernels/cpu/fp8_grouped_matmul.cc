// CPU Fp8GroupedMatmul (contract: engine/kernels/op_declarations.inc): the reference of the FP8
// grouped GEMMs, in the contract's order of operations: per output element, f32 partial sums over
// 128-element tiles of the contracted dimension, each scaled by its two tiles' scales and added
// into an f32 accumulator with one fma. Plain loops over the operands decoded to f32 (exactly).
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

}  // namespace moe::cpu
