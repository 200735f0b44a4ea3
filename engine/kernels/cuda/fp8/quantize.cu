// CUDA QuantizeRowTiles, QuantizeBlocks, DequantizeRowTiles and DequantizeBlocks (contracts:
// engine/kernels/op_declarations.inc): the same f32 operations as the CPU reference
// (Fp8ScalingOf, engine/kernels/fp8_scaling.h), with the device's cvt.rn.satfinite.e4m3x2.f32
// for the rounding that FloatToE4M3 emulates on the host, so q and the scales agree bit for bit.
// Both layouts are Fp8TiledMatrices (row tiles: one matrix, tile_rows 1; blocks: a matrix per
// group, tile_rows 128). Row tiles (activations, every micro-batch): a warp per 1 x 128 tile, a
// quad of four consecutive elements a lane (one load and one 4-byte store where the rows allow
// it), the warp's max by shuffles, then the tile's elements. Blocks (weights, once a step): one
// block of kTileThreads threads per 128 x 128 block, held in registers (quantize_tile.cuh): the
// block's max, then its elements, stored row by row, and for the transposed form in the same pass
// staged transposed in shared memory and stored as rows of the transposed matrix. A max is exact
// in any order, so both agree with the CPU bit for bit. Dequantising is elementwise.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/fp8/quantize_tile.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda {
namespace {

constexpr int kRowTileWarps = 8;  // row tiles per block of QuantizeRowTilesKernel

// Warp w of block b quantises row tile b * kRowTileWarps + w of m (tile_rows 1, one group), a lane
// its quad of elements 4 lane .. 4 lane + 3 (`vector`: QuadRows of x and of q).
template <typename T>
__global__ void QuantizeRowTilesKernel(Fp8TiledMatrices m, const T* x, bool vector,
                                       __nv_fp8_storage_t* q, float* scales) {
  const int64_t tile = int64_t{blockIdx.x} * kRowTileWarps + threadIdx.x / 32;
  if (tile >= m.tiles()) return;  // warp-uniform
  const int c = static_cast<int>(threadIdx.x % 32) * kTileColsPerLane;
  const int64_t row = tile / m.col_tiles(), c0 = tile % m.col_tiles() * kFp8TileSize;
  const int n = static_cast<int>(min(m.cols - c0, kFp8TileSize)) - c;
  const T* const p = x + row * m.cols + c0 + c;
  TileSlice<T> row_slice;  // its row 0
  row_slice.Set(0,
                vector && n >= kTileColsPerLane ? FetchQuad<true>(p, n) : FetchQuad<false>(p, n));
  const Fp8TileScaling scaling = Fp8ScalingOf(WarpReduce(row_slice.RowAmax(0), MaxOp{}));
  if (c == 0) scales[tile] = scaling.scale;
  StoreQuantizedQuad<false>(row_slice, 0, scaling.multiplier, n, vector, q + row * m.cols + c0 + c);
}

// Block (tile, group) = (blockIdx.x, blockIdx.y) of m (tile_rows kFp8TileSize), kTileThreads
// threads: q and scales, and q_t and scales_t (each matrix transposed) unless q_t is null
// (row_bytes: m.cols sizeof(T); `vector`: QuadRows of x and of q).
template <typename T>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm<T>)
    QuantizeBlocksKernel(Fp8TiledMatrices m, const T* x, int row_bytes, bool vector,
                         __nv_fp8_storage_t* q, float* scales, __nv_fp8_storage_t* q_t,
                         float* scales_t) {
  const int64_t group = blockIdx.y, tile = blockIdx.x;
  const int64_t r0 = tile / m.col_tiles() * kFp8TileSize, c0 = tile % m.col_tiles() * kFp8TileSize;
  const int rows = static_cast<int>(min(m.rows - r0, kFp8TileSize));
  const int cols = static_cast<int>(min(m.cols - c0, kFp8TileSize));
  TileSlice<T> slice;
  const MatrixRows<T> matrix{x + group * m.elements(), static_cast<int>(m.rows), nullptr, row_bytes,
                             vector};  // QuantizeBlocks checks that the rows fit an int
  LoadTile(matrix, r0, c0, rows, cols, slice);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kTileRowsPerWarp; ++i) amax = fmaxf(amax, slice.RowAmax(i));
  const Fp8TileScaling scaling = Fp8ScalingOf(BlockMax(amax));
  if (threadIdx.x == 0) {
    scales[group * m.tiles() + tile] = scaling.scale;
    if (scales_t != nullptr) scales_t[group * m.tiles() + m.TransposedTile(tile)] = scaling.scale;
  }
  StoreSliceRows(
      slice, [&](int) { return scaling.multiplier; }, rows, cols, vector,
      q + group * m.elements() + r0 * m.cols + c0, m.cols);
  if (q_t == nullptr) return;  // block-uniform
  __shared__ StagedTile staged;
  StageTransposed(
      slice, [&](int) { return scaling.multiplier; }, staged);
  __syncthreads();
  StoreTransposed(staged, cols, rows, q_t + group * m.elements() + c0 * m.rows + r0, m.rows);
}

template <typename T>
__global__ void DequantizeKernel(Fp8TiledMatrices m, const __nv_fp8_storage_t* q,
                                 const float* scales, T* x) {
  const int64_t total = m.groups * m.elements();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t group = i / m.elements(), r = i % m.elements() / m.cols, c = i % m.cols;
    const int64_t tile = m.TileOf(r, c);
    const float value = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3)));
    x[i] = FromFloat<T>(value * scales[group * m.tiles() + tile]);
  }
}

// Whether x's rows and q's can be read and written a quad at a time (both of `cols` elements).
template <typename T>
bool QuadRowsOf(const Tensor& x, const Tensor& q, int64_t cols) {
  return QuadRows(Ptr<const T>(x), cols) && QuadRows(Ptr<const __nv_fp8_storage_t>(q), cols);
}

void Dequantize(const Fp8TiledMatrices& m, const Tensor& q, const Tensor& scales, const Tensor& x) {
  if (x.numel() == 0) return;
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    constexpr int kThreads = 256;
    DequantizeKernel<T><<<BlocksFor(x.numel(), kThreads), kThreads, 0, StreamOf(x)>>>(
        m, Ptr<const __nv_fp8_storage_t>(q), Ptr<const float>(scales), Ptr<T>(x));
    MOE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void QuantizeRowTiles(const Tensor& x, const Tensor& q, const Tensor& scales) {
  const Fp8TiledMatrices m = Fp8RowTiles(x.dim(0), x.dim(1));
  if (m.tiles() == 0) return;
  const int64_t blocks = (m.tiles() + kRowTileWarps - 1) / kRowTileWarps;
  CHECK(blocks <= INT32_MAX) << "fp8 row-tile quantisation grid of " << blocks << " blocks";
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    QuantizeRowTilesKernel<T>
        <<<static_cast<unsigned>(blocks), 32 * kRowTileWarps, 0, StreamOf(x)>>>(
            m, Ptr<const T>(x), QuadRowsOf<T>(x, q, m.cols), Ptr<__nv_fp8_storage_t>(q),
            Ptr<float>(scales));
    MOE_CUDA_CHECK_LAUNCH();
  });
}

void QuantizeBlocks(const Tensor& w, const Tensor& q, const Tensor& scales, const Tensor& q_t,
                    const Tensor& scales_t) {
  const Fp8TiledMatrices m = Fp8Blocks(w.dim(0), w.dim(1), w.dim(2));
  if (m.groups == 0 || m.tiles() == 0) return;
  CHECK(m.tiles() <= INT32_MAX && m.groups <= 65535)
      << "fp8 block quantisation grid of " << m.tiles() << " tiles x " << m.groups << " groups";
  SourceInt(m.rows, "rows");  // a matrix's rows and row bytes as ints (MatrixRows)
  DispatchFloat(w.dtype(), [&]<typename T>(TypeTag<T>) {
    const dim3 grid(static_cast<unsigned>(m.tiles()), static_cast<unsigned>(m.groups));
    QuantizeBlocksKernel<T><<<grid, kTileThreads, 0, StreamOf(w)>>>(
        m, Ptr<const T>(w), SourceInt(m.cols * int64_t{sizeof(T)}, "row bytes"),
        QuadRowsOf<T>(w, q, m.cols), Ptr<__nv_fp8_storage_t>(q), Ptr<float>(scales),
        Ptr<__nv_fp8_storage_t>(q_t), Ptr<float>(scales_t));
    MOE_CUDA_CHECK_LAUNCH();
  });
}

void DequantizeRowTiles(const Tensor& q, const Tensor& scales, const Tensor& x) {
  Dequantize(Fp8RowTiles(x.dim(0), x.dim(1)), q, scales, x);
}

void DequantizeBlocks(const Tensor& q, const Tensor& scales, const Tensor& w) {
  Dequantize(Fp8Blocks(w.dim(0), w.dim(1), w.dim(2)), q, scales, w);
}

}  // namespace moe::cuda
