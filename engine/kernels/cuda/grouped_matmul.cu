// CUDA GroupedMatmul and GroupedMatmulWeightGrad (contracts: engine/kernels/op_declarations.inc),
// bf16 on the tensor-core core of grouped_gemm.cuh; the offsets stay in device memory.
// - GroupedMatmul: C = x rows of a group (K-major) times w_g, K-major (n, k) when transposed,
//   MN-major (k, n) otherwise; grid of RowTileBound x column tiles in BandedTile order, each
//   block finding its group's rows; bf16 stores straight from the accumulators.
// - GroupedMatmulWeightGrad: dw_g (n, k) += dy_g^T (n, rows_g) · x_g (rows_g, k): both operands
//   MN-major (their token rows are the reduction), grid (tiles of dw_g, groups); each block
//   reads its group's row range and reduces over all of it, so it adds its fp32 tile to dw with
//   plain loads and stores (no atomics); a group without rows returns at once.
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/grouped_gemm.cuh"

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
using grouped::MNMajorTile;

// y (rows, n) = x (rows, k) · op(w_g); w (groups, n, k) if kTransposeW, else (groups, k, n).
template <bool kTransposeW>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedMatmulKernel(const bf16* x, const bf16* w, bf16* y, GroupedRows groups, int k, int n,
                        int row_tiles, int col_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  const grouped::TileIndex index = grouped::BandedTile(blockIdx.x, row_tiles, col_tiles);
  const grouped::RowTile tile =
      grouped::FindRowTile(groups.offsets, groups.groups, groups.rows, index.row);
  if (tile.group < 0) return;
  const int n0 = index.col * kBlockN;
  const bf16* const wg = w + static_cast<int64_t>(tile.group) * n * k;
  const KMajorTile<kBlockM> a = grouped::TokenRows(x, k, tile);
  Accumulators acc;
  if constexpr (kTransposeW) {
    const KMajorTile<kBlockN> b(
        wg,
        [&](int i) -> const bf16* {
          return n0 + i < n ? wg + static_cast<int64_t>(n0 + i) * k : nullptr;
        },
        k);
    grouped::MultiplyTiles(a, b, k, smem, acc);
  } else {
    const MNMajorTile<kBlockN> b(wg + n0, n, n - n0, k);
    grouped::MultiplyTiles(a, b, k, smem, acc);
  }
#pragma unroll
  for (int mi = 0; mi < kMmaTilesM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = tile.begin + AccRow(mi, half);
      if (row >= tile.end) continue;
#pragma unroll
      for (int ni = 0; ni < kMmaTilesN; ++ni) {
        const int col = n0 + AccCol(ni);
        if (col >= n) continue;
        *reinterpret_cast<__nv_bfloat162*>(y + static_cast<int64_t>(row) * n + col) =
            __floats2bfloat162_rn(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
    }
  }
}

// dw_g (n, k) += dy_g^T · x_g. grid (m tiles * col_tiles, groups).
__global__ void __launch_bounds__(kThreads, 1)
    GroupedWeightGradKernel(const bf16* dy, const bf16* x, float* dw, GroupedRows groups, int n,
                            int k, int col_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int g = blockIdx.y;
  const int begin = groups.offsets[g], end = groups.offsets[g + 1];
  DEVICE_CHECK(0 <= begin && begin <= end && end <= groups.rows);
  if (begin == end) return;
  const int m0 = blockIdx.x / col_tiles * kBlockM, n0 = blockIdx.x % col_tiles * kBlockN;
  const MNMajorTile<kBlockM> a(dy + static_cast<int64_t>(begin) * n + m0, n, n - m0, end - begin);
  const MNMajorTile<kBlockN> b(x + static_cast<int64_t>(begin) * k + n0, k, k - n0, end - begin);
  Accumulators acc;
  grouped::MultiplyTiles(a, b, end - begin, smem, acc);
  float* const dwg = dw + static_cast<int64_t>(g) * n * k;
#pragma unroll
  for (int mi = 0; mi < kMmaTilesM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + AccRow(mi, half);
      if (row >= n) continue;
      float* const dw_row = dwg + static_cast<int64_t>(row) * k;
      float2 sums[kMmaTilesN];  // all loads of the row's pieces first, so they overlap
#pragma unroll
      for (int ni = 0; ni < kMmaTilesN; ++ni) {
        const int col = n0 + AccCol(ni);
        if (col < k) sums[ni] = *reinterpret_cast<const float2*>(dw_row + col);
      }
#pragma unroll
      for (int ni = 0; ni < kMmaTilesN; ++ni) {
        const int col = n0 + AccCol(ni);
        if (col < k) {
          *reinterpret_cast<float2*>(dw_row + col) = make_float2(
              sums[ni].x + acc[mi][ni][2 * half], sums[ni].y + acc[mi][ni][2 * half + 1]);
        }
      }
    }
  }
}

}  // namespace

void GroupedMatmul(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y,
                   bool transpose_w) {
  const int64_t rows = x.dim(0), k = x.dim(1), n = y.dim(1);
  if (rows == 0 || n == 0) return;
  const GroupedRows groups = grouped::MakeGroupedRows(offsets, rows);
  const int64_t row_tiles = grouped::RowTileBound(rows, groups.groups);
  const int64_t col_tiles = grouped::CeilDiv(n, kBlockN);
  const dim3 grid(grouped::Int(row_tiles * col_tiles));
  const int smem_bytes = transpose_w
                             ? grouped::SmemBytes<KMajorTile<kBlockM>, KMajorTile<kBlockN>>()
                             : grouped::SmemBytes<KMajorTile<kBlockM>, MNMajorTile<kBlockN>>();
  grouped::Launch(transpose_w ? GroupedMatmulKernel<true> : GroupedMatmulKernel<false>, grid,
                  smem_bytes, StreamOf(x), Ptr<const bf16>(x), Ptr<const bf16>(w), Ptr<bf16>(y),
                  groups, grouped::Int(k), grouped::Int(n), grouped::Int(row_tiles),
                  grouped::Int(col_tiles));
}

void GroupedMatmulWeightGrad(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                             const Tensor& dw) {
  const int64_t rows = x.dim(0), n = dy.dim(1), k = x.dim(1);
  if (rows == 0 || dw.numel() == 0) return;
  const GroupedRows groups = grouped::MakeGroupedRows(offsets, rows);
  CHECK_LE(groups.groups, 65535) << "grouped weight gradient: groups must fit a grid dimension";
  const int64_t col_tiles = grouped::CeilDiv(k, kBlockN);
  const dim3 grid(grouped::Int(grouped::CeilDiv(n, kBlockM) * col_tiles), groups.groups);
  grouped::Launch(GroupedWeightGradKernel, grid,
                  grouped::SmemBytes<MNMajorTile<kBlockM>, MNMajorTile<kBlockN>>(), StreamOf(x),
                  Ptr<const bf16>(dy), Ptr<const bf16>(x), Ptr<float>(dw), groups, grouped::Int(n),
                  grouped::Int(k), grouped::Int(col_tiles));
}

}  // namespace moe::cuda
