// CPU QuantizeRowTiles, QuantizeBlocks, QuantizeColumnTiles, SwigluForwardQuantized and
// SwigluBackwardQuantized (the SwiGLU op, then the quantisation), DequantizeRowTiles and
// DequantizeBlocks (contracts:
// engine/kernels/op_declarations.inc): the reference numerics of the blockwise FP8 recipe, which
// the CUDA kernels reproduce bit for bit: tile by tile (Fp8TiledMatrices), the amax, then the
// tile's elements. Inputs and outputs f32 or bf16.
#include <algorithm>
#include <cmath>
#include <span>

#include "engine/core/float8.h"
#include "engine/kernels/cpu/cpu_ops.h"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cpu {
namespace {

// Calls fn(element index within the matrix) for every element of m's tile `tile`, row by row.
template <typename Fn>
void ForEachElement(const Fp8TiledMatrices& m, int64_t tile, Fn&& fn) {
  const int64_t r0 = tile / m.col_tiles() * m.tile_rows;
  const int64_t c0 = tile % m.col_tiles() * kFp8TileSize;
  const int64_t r1 = std::min(m.rows, r0 + m.tile_rows), c1 = std::min(m.cols, c0 + kFp8TileSize);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) fn(r * m.cols + c);
  }
}

// transposed: q and the scales written as each matrix's transpose (QuantizeBlocks' contract).
void Quantize(const Fp8TiledMatrices& m, const Tensor& x, const Tensor& q, const Tensor& scales,
              bool transposed = false) {
  const auto q_index = [&](int64_t i) { return transposed ? i % m.cols * m.rows + i / m.cols : i; };
  DispatchStorage(x.dtype(), [&]<typename T>(StorageTag<T>) {
    for (int64_t g = 0; g < m.groups; ++g) {
      const T* in = x.data<T>() + g * m.elements();
      Float8E4M3* out = q.data<Float8E4M3>() + g * m.elements();
      float* tile_scales = scales.data<float>() + g * m.tiles();
      for (int64_t tile = 0; tile < m.tiles(); ++tile) {
        float amax = 0.0f;
        ForEachElement(m, tile,
                       [&](int64_t i) { amax = std::fmax(amax, std::fabs(ToFloat(in[i]))); });
        const Fp8TileScaling scaling = Fp8ScalingOf(amax);
        tile_scales[transposed ? m.TransposedTile(tile) : tile] = scaling.scale;
        ForEachElement(m, tile, [&](int64_t i) {
          out[q_index(i)] = FloatToE4M3(ToFloat(in[i]) * scaling.multiplier);
        });
      }
    }
  });
}

void Dequantize(const Fp8TiledMatrices& m, const Tensor& q, const Tensor& scales, const Tensor& x) {
  DispatchStorage(x.dtype(), [&]<typename T>(StorageTag<T>) {
    for (int64_t g = 0; g < m.groups; ++g) {
      const Float8E4M3* in = q.data<Float8E4M3>() + g * m.elements();
      const float* tile_scales = scales.data<float>() + g * m.tiles();
      T* out = x.data<T>() + g * m.elements();
      for (int64_t tile = 0; tile < m.tiles(); ++tile) {
        ForEachElement(m, tile, [&](int64_t i) {
          out[i] = FromFloat<T>(E4M3ToFloat(in[i]) * tile_scales[tile]);
        });
      }
    }
  });
}

}  // namespace

void QuantizeRowTiles(const Tensor& x, const Tensor& q, const Tensor& scales) {
  Quantize(Fp8RowTiles(x.dim(0), x.dim(1)), x, q, scales);
}

void QuantizeBlocks(const Tensor& w, const Tensor& q, const Tensor& scales, const Tensor& q_t,
                    const Tensor& scales_t) {
  const Fp8TiledMatrices m = Fp8Blocks(w.dim(0), w.dim(1), w.dim(2));
  Quantize(m, w, q, scales);
  if (q_t.defined()) Quantize(m, w, q_t, scales_t, /*transposed=*/true);
}

void QuantizeColumnTiles(const Tensor& x, const Tensor& offsets, const Tensor& q,
                         const Tensor& scales, const Tensor& row_q, const Tensor& row_scales,
                         const Tensor& index) {
  if (index.defined()) {  // the gathered rows, then as without an index
    const Tensor gathered = Tensor::Empty({index.dim(0), x.dim(1)}, x.dtype(), x.device());
    GatherRows(x, index, gathered);
    return QuantizeColumnTiles(gathered, offsets, q, scales, row_q, row_scales);
  }
  if (row_q.defined()) QuantizeRowTiles(x, row_q, row_scales);
  const int64_t k = x.dim(1), tokens = q.dim(1);
  const std::span<const int32_t> bounds = offsets.values<int32_t>();
  std::fill_n(q.data<Float8E4M3>(), q.numel(), Float8E4M3{});  // the padding's zeros
  std::fill_n(scales.data<float>(), scales.numel(), 0.0f);
  DispatchStorage(x.dtype(), [&]<typename T>(StorageTag<T>) {
    const T* in = x.data<T>();
    Float8E4M3* out = q.data<Float8E4M3>();
    for (size_t g = 0; g + 1 < bounds.size(); ++g) {
      for (int64_t t = 0; t < Fp8ColumnTileCount(bounds[g], bounds[g + 1]); ++t) {
        const auto [r0, r1] = Fp8ColumnTileRows(bounds[g], bounds[g + 1], t);
        float* tile_scales = scales.data<float>() + Fp8ColumnTileSlot(g, bounds[g], t) * k;
        for (int64_t c = 0; c < k; ++c) {
          float amax = 0.0f;
          for (int64_t r = r0; r < r1; ++r)
            amax = std::fmax(amax, std::fabs(ToFloat(in[r * k + c])));
          const Fp8TileScaling scaling = Fp8ScalingOf(amax);
          tile_scales[c] = scaling.scale;
          for (int64_t r = r0; r < r1; ++r) {
            out[c * tokens + Fp8ColumnToken(g, bounds[g], r)] =
                FloatToE4M3(ToFloat(in[r * k + c]) * scaling.multiplier);
          }
        }
      }
    }
  });
}

void SwigluForwardQuantized(const Tensor& h, const Tensor& scale, const Tensor& offsets,
                            const Tensor& q, const Tensor& scales, const Tensor& row_q,
                            const Tensor& row_scales) {
  const Tensor a = Tensor::Empty({h.dim(0), h.dim(1) / 2}, h.dtype(), h.device());
  SwigluForward(h, scale, a);
  if (q.defined()) {
    QuantizeColumnTiles(a, offsets, q, scales, row_q, row_scales);
  } else {
    QuantizeRowTiles(a, row_q, row_scales);
  }
}

void SwigluBackwardQuantized(const Tensor& da, const Tensor& h, const Tensor& scale,
                             const Tensor& offsets, const Tensor& q, const Tensor& scales,
                             const Tensor& row_q, const Tensor& row_scales, const Tensor& dscale) {
  const Tensor dh = Tensor::Empty(h.shape(), h.dtype(), h.device());
  SwigluBackward(da, h, scale, dh, dscale);
  QuantizeColumnTiles(dh, offsets, q, scales, row_q, row_scales);
}

void DequantizeRowTiles(const Tensor& q, const Tensor& scales, const Tensor& x) {
  Dequantize(Fp8RowTiles(x.dim(0), x.dim(1)), q, scales, x);
}

void DequantizeBlocks(const Tensor& q, const Tensor& scales, const Tensor& w) {
  Dequantize(Fp8Blocks(w.dim(0), w.dim(1), w.dim(2)), q, scales, w);
}

}  // namespace moe::cpu
