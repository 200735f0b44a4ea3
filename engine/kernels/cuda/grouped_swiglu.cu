// CUDA GroupedMatmulSwiglu and GroupedMatmulSwigluBackward (contracts:
// engine/kernels/op_declarations.inc): grouped GEMMs on the core of grouped_gemm.cuh with SwiGLU
// (swiglu.cuh) in their epilogues; bf16, offsets in device memory, grids as GroupedMatmul's.
// - Forward: a block tile covers kSwigluBlockCols gate columns j and the matching up columns
//   f + j. Its B tile takes, for warp column wn, the kSwigluWarpCols gate rows of w_g at
//   j0 + wn * kSwigluWarpCols + [0, kSwigluWarpCols) and then the matching up rows, so every
//   thread holds the gate (acc[.][ni]) and up (acc[.][ni + kMmaTilesN / 2]) of the same (row, j).
//   The epilogue rounds both to bf16, stores them into h, and computes a from the rounded values.
// - Backward: da = dy · w_g (w_g (n, f) is MN-major) stays in the fp32 accumulators; the epilogue
//   reads h's gate and up at the same (row, j), writes dh, and sums silu(gate) * up * da over the
//   block's columns for each row (quad shuffles, then the 4 warp columns in order through shared
//   memory) into partials (rows, column tiles); SumRowPartials adds those in column order. No
//   float atomics: bit-identical run to run.
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/grouped_gemm.cuh"
#include "engine/kernels/cuda/swiglu.cuh"

namespace moe::cuda {
namespace {

using grouped::AccCol;
using grouped::AccRow;
using grouped::Accumulators;
using grouped::GroupedRows;
using grouped::kBlockM;
using grouped::kBlockN;
using grouped::KMajorTile;
using grouped::kMmaTilesM;
using grouped::kMmaTilesN;
using grouped::kThreads;
using grouped::kWarpsN;
using grouped::kWarpTileN;
using grouped::MNMajorTile;

constexpr int kSwigluWarpCols = kWarpTileN / 2;  // gate columns per warp column
constexpr int kSwigluBlockCols = kBlockN / 2;    // gate columns per block tile

// h (rows, 2f) = x (rows, k) · w_g^T, w (groups, 2f, k); a (rows, f) = swiglu(h) * scale.
__global__ void __launch_bounds__(kThreads, 1)
    GroupedMatmulSwigluKernel(const bf16* x, const bf16* w, const float* scale, bf16* h, bf16* a,
                              GroupedRows groups, int k, int f, int row_tiles, int col_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  const grouped::TileIndex index = grouped::BandedTile(blockIdx.x, row_tiles, col_tiles);
  const grouped::RowTile tile =
      grouped::FindRowTile(groups.offsets, groups.groups, groups.rows, index.row);
  if (tile.group < 0) return;
  const int j0 = index.col * kSwigluBlockCols;
  const bf16* const wg = w + static_cast<int64_t>(tile.group) * 2 * f * k;
  const KMajorTile<kBlockN> weights(
      wg,
      [&](int i) -> const bf16* {
        const int j = j0 + i / kWarpTileN * kSwigluWarpCols + i % kSwigluWarpCols;
        const bool up = i % kWarpTileN >= kSwigluWarpCols;
        return j < f ? wg + static_cast<int64_t>(up ? f + j : j) * k : nullptr;
      },
      k);
  Accumulators acc;
  grouped::MultiplyTiles(grouped::TokenRows(x, k, tile), weights, k, smem, acc);
  const int64_t h_stride = 2 * static_cast<int64_t>(f);
#pragma unroll
  for (int mi = 0; mi < kMmaTilesM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = tile.begin + AccRow(mi, half);
      if (row >= tile.end) continue;
      const float s = scale[row];
#pragma unroll
      for (int ni = 0; ni < kMmaTilesN / 2; ++ni) {
        // AccCol(ni) is B tile row i with i % kWarpTileN < kSwigluWarpCols: gate column j.
        const int j = j0 + grouped::WarpN() * kSwigluWarpCols + AccCol(ni) % kWarpTileN;
        if (j >= f) continue;
        const __nv_bfloat162 gate =
            __floats2bfloat162_rn(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
        const __nv_bfloat162 up = __floats2bfloat162_rn(acc[mi][ni + kMmaTilesN / 2][2 * half],
                                                        acc[mi][ni + kMmaTilesN / 2][2 * half + 1]);
        bf16* const h_row = h + row * h_stride;
        *reinterpret_cast<__nv_bfloat162*>(h_row + j) = gate;
        *reinterpret_cast<__nv_bfloat162*>(h_row + f + j) = up;
        const float2 g = __bfloat1622float2(gate), u = __bfloat1622float2(up);
        *reinterpret_cast<__nv_bfloat162*>(a + static_cast<int64_t>(row) * f + j) =
            __floats2bfloat162_rn(Swiglu(g.x, u.x, s), Swiglu(g.y, u.y, s));
      }
    }
  }
}

// da = dy (rows, n) · w_g, w (groups, n, f); dh (rows, 2f) = SwiGLU backward of da at h;
// partials[row * col_tiles + column tile] = this block's part of dscale[row].
__global__ void __launch_bounds__(kThreads, 1)
    GroupedMatmulSwigluBackwardKernel(const bf16* dy, const bf16* w, const bf16* h,
                                      const float* scale, bf16* dh, float* partials,
                                      GroupedRows groups, int n, int f, int row_tiles,
                                      int col_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float row_sums[kWarpsN][kBlockM];
  const grouped::TileIndex index = grouped::BandedTile(blockIdx.x, row_tiles, col_tiles);
  const grouped::RowTile tile =
      grouped::FindRowTile(groups.offsets, groups.groups, groups.rows, index.row);
  if (tile.group < 0) return;
  const int j0 = index.col * kBlockN;
  const bf16* const wg = w + static_cast<int64_t>(tile.group) * n * f;
  Accumulators acc;
  grouped::MultiplyTiles(grouped::TokenRows(dy, n, tile),
                         MNMajorTile<kBlockN>(wg + j0, f, f - j0, n), n, smem, acc);
  const int64_t h_stride = 2 * static_cast<int64_t>(f);
#pragma unroll
  for (int mi = 0; mi < kMmaTilesM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = tile.begin + AccRow(mi, half);
      float sum = 0.0f;
      if (row < tile.end) {
        const float s = scale[row];
        const bf16* const h_row = h + row * h_stride;
        bf16* const dh_row = dh + row * h_stride;
        __nv_bfloat162 gate[kMmaTilesN], up[kMmaTilesN];  // all loads first, so they overlap
#pragma unroll
        for (int ni = 0; ni < kMmaTilesN; ++ni) {
          const int j = j0 + AccCol(ni);
          if (j >= f) continue;
          gate[ni] = *reinterpret_cast<const __nv_bfloat162*>(h_row + j);
          up[ni] = *reinterpret_cast<const __nv_bfloat162*>(h_row + f + j);
        }
#pragma unroll
        for (int ni = 0; ni < kMmaTilesN; ++ni) {
          const int j = j0 + AccCol(ni);
          if (j >= f) continue;
          const float2 g = __bfloat1622float2(gate[ni]), u = __bfloat1622float2(up[ni]);
          const SwigluGrads lo = SwigluBackwardAt(acc[mi][ni][2 * half], g.x, u.x, s);
          const SwigluGrads hi = SwigluBackwardAt(acc[mi][ni][2 * half + 1], g.y, u.y, s);
          *reinterpret_cast<__nv_bfloat162*>(dh_row + j) =
              __floats2bfloat162_rn(lo.dgate, hi.dgate);
          *reinterpret_cast<__nv_bfloat162*>(dh_row + f + j) =
              __floats2bfloat162_rn(lo.dup, hi.dup);
          sum += lo.dscale_term + hi.dscale_term;
        }
      }
      // The quad of lanes 4g .. 4g + 3 holds this row's columns of the warp.
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (grouped::Lane() % 4 == 0) row_sums[grouped::WarpN()][AccRow(mi, half)] = sum;
    }
  }
  __syncthreads();
  const int row = tile.begin + static_cast<int>(threadIdx.x);
  if (threadIdx.x < kBlockM && row < tile.end) {
    float total = 0.0f;
#pragma unroll
    for (int wn = 0; wn < kWarpsN; ++wn) total += row_sums[wn][threadIdx.x];
    partials[static_cast<int64_t>(row) * col_tiles + index.col] = total;
  }
}

// dscale[row] = sum over t in order of partials[row * tiles + t].
__global__ void SumRowPartials(const float* partials, int rows, int tiles, float* dscale) {
  for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += gridDim.x * blockDim.x) {
    float total = 0.0f;
    for (int t = 0; t < tiles; ++t) total += partials[static_cast<int64_t>(row) * tiles + t];
    dscale[row] = total;
  }
}

}  // namespace

void GroupedMatmulSwiglu(const Tensor& x, const Tensor& w, const Tensor& offsets,
                         const Tensor& scale, const Tensor& h, const Tensor& a) {
  const int64_t rows = x.dim(0), k = x.dim(1), f = a.dim(1);
  if (rows == 0 || f == 0) return;
  const GroupedRows groups = grouped::MakeGroupedRows(offsets, rows);
  const int64_t row_tiles = grouped::RowTileBound(rows, groups.groups);
  const int64_t col_tiles = grouped::CeilDiv(f, kSwigluBlockCols);
  grouped::Launch(GroupedMatmulSwigluKernel, dim3(grouped::Int(row_tiles * col_tiles)),
                  grouped::SmemBytes<KMajorTile<kBlockM>, KMajorTile<kBlockN>>(), StreamOf(x),
                  Ptr<const bf16>(x), Ptr<const bf16>(w), Ptr<const float>(scale), Ptr<bf16>(h),
                  Ptr<bf16>(a), groups, grouped::Int(k), grouped::Int(f), grouped::Int(row_tiles),
                  grouped::Int(col_tiles));
}

void GroupedMatmulSwigluBackward(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                 const Tensor& h, const Tensor& scale, const Tensor& dh,
                                 const Tensor& dscale) {
  const int64_t rows = dy.dim(0), n = dy.dim(1), f = h.dim(1) / 2;
  if (rows == 0) return;
  const GroupedRows groups = grouped::MakeGroupedRows(offsets, rows);
  const int64_t row_tiles = grouped::RowTileBound(rows, groups.groups);
  const int64_t col_tiles = grouped::CeilDiv(f, kBlockN);
  cudaStream_t stream = StreamOf(dy);
  // Dropped on return; the stream-ordered allocator keeps it until the kernels are done.
  const Tensor partials = Tensor::Empty({rows, col_tiles}, DType::kF32, dy.device());
  if (col_tiles > 0) {
    grouped::Launch(GroupedMatmulSwigluBackwardKernel, dim3(grouped::Int(row_tiles * col_tiles)),
                    grouped::SmemBytes<KMajorTile<kBlockM>, MNMajorTile<kBlockN>>(), stream,
                    Ptr<const bf16>(dy), Ptr<const bf16>(w), Ptr<const bf16>(h),
                    Ptr<const float>(scale), Ptr<bf16>(dh), Ptr<float>(partials), groups,
                    grouped::Int(n), grouped::Int(f), grouped::Int(row_tiles),
                    grouped::Int(col_tiles));
  }
  SumRowPartials<<<BlocksFor(rows, 256), 256, 0, stream>>>(
      Ptr<const float>(partials), groups.rows, grouped::Int(col_tiles), Ptr<float>(dscale));
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
