// The bf16 tensor-core core of the grouped GEMM kernels (grouped_matmul.cu, grouped_swiglu.cu):
// one block computes a kBlockM x kBlockN tile of C = A (M, K) · B (K, N) with fp32 accumulation;
// the kernels around it choose the operands and the epilogue.
//
// - Block: 8 warps as 2 (M) x 4 (N), each owning a 64 x 64 piece of the tile, held as
//   acc[4][8][4] fp32 per thread (mma.sync m16n8k16; AccRow / AccCol give the positions).
// - Reduction in steps of kBlockK through a kStages-deep ring of shared tiles filled by cp.async
//   (16-byte pieces; rows or columns outside the operand, and reduction indices past its depth,
//   are zero-filled), so loads run kStages - 1 steps ahead of the tensor cores.
// - Operand tiles as they lie in memory: KMajorTile (each tile row is an M or N index with its
//   K values contiguous: token rows, (out, in) weight rows) or MNMajorTile (each tile row is a
//   reduction index with M or N values contiguous: (in, out) weights, the token rows of a weight
//   gradient). Shared rows are padded by 8 elements, so the 8 rows of one ldmatrix phase fall in
//   8 different bank groups; ldmatrix.trans turns MN-major tiles into the same fragments.
// - Rows grouped by expert without host synchronisation: kernels over token rows launch
//   RowTileBound row tiles (an upper bound of the groups' tile count) and each block finds its
//   group and rows from the device offsets (FindRowTile). A row tile never crosses into the next
//   group; blocks past the last tile exit. BandedTile orders the blocks so that those resident
//   together share operand tiles in L2.
// MultiplyTiles and FindRowTile synchronise the block: every thread must call them.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>
#include <utility>

#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/mma_primitives.cuh"

namespace moe::cuda::grouped {

constexpr int kBlockM = 128;
constexpr int kBlockN = 256;
constexpr int kBlockK = 32;
constexpr int kStages = 4;
constexpr int kWarpsM = 2;
constexpr int kWarpsN = 4;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWarpTileM = kBlockM / kWarpsM;  // 64
constexpr int kWarpTileN = kBlockN / kWarpsN;  // 64
constexpr int kMmaTilesM = kWarpTileM / 16;    // 4 m16 tiles per warp
constexpr int kMmaTilesN = kWarpTileN / 8;     // 8 n8 tiles per warp
constexpr int kBandRows = 8;                   // row tiles per band (BandedTile)
static_assert(kBlockK % 16 == 0 && kWarpTileM % 16 == 0 && kWarpTileN % 16 == 0);

using Accumulators = float[kMmaTilesM][kMmaTilesN][4];

__device__ __forceinline__ int WarpM() { return static_cast<int>(threadIdx.x) / 32 % kWarpsM; }
__device__ __forceinline__ int WarpN() { return static_cast<int>(threadIdx.x) / 32 / kWarpsM; }

// Row within the block tile of acc[mi][*][2 * half] and acc[mi][*][2 * half + 1].
__device__ __forceinline__ int AccRow(int mi, int half) {
  return WarpM() * kWarpTileM + mi * 16 + static_cast<int>(threadIdx.x) % 32 / 4 + 8 * half;
}

// Column within the block tile of acc[*][ni][0] (and [2]); acc[*][ni][1] (and [3]) is the next.
__device__ __forceinline__ int AccCol(int ni) {
  return WarpN() * kWarpTileN + ni * 8 + static_cast<int>(threadIdx.x) % 4 * 2;
}

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x) % 32; }

// kRows tile rows, each an operand row with its reduction index contiguous in memory. Each
// thread copies the same 8-index piece of kPerThread tile rows, whose addresses the caller gives
// once: row(i) is the address of tile row i's reduction index 0, or nullptr for a row outside
// the operand (zeros). `depth`, the operand's reduction length, is a multiple of 8.
template <int kRows>
class KMajorTile {
 public:
  static constexpr int kStride = kBlockK + 8;
  static constexpr int kElems = kRows * kStride;

  // `operand`: any valid address of the operand (the unread source of zero-filled pieces).
  template <typename RowAddress>
  __device__ KMajorTile(const bf16* operand, RowAddress row, int depth)
      : operand_(operand), depth_(depth) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) src_[j] = row(FirstRow() + j * kRowStep);
  }

  // Copies reduction indices [kt * kBlockK, (kt + 1) * kBlockK) into `tile`.
  __device__ void Load(bf16* tile, int kt) const {
    const int k = kt * kBlockK + Column();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const bool valid = src_[j] != nullptr && k < depth_;
      CpAsync16(tile + (FirstRow() + j * kRowStep) * kStride + Column(),
                valid ? src_[j] + k : operand_, valid);
    }
  }

  // The A operand (16, 16) of tile rows [m, m + 16), reduction indices [16 kk, 16 kk + 16).
  __device__ static void LoadA(const bf16* tile, int m, int kk, uint32_t (&a)[4]) {
    LdMatrixX4(a, tile + (m + Lane() % 16) * kStride + kk * 16 + Lane() / 16 * 8);
  }

  // B operands (16, 8) of tile rows [n, n + 8) in b[0], b[1] and [n + 8, n + 16) in b[2], b[3].
  __device__ static void LoadB(const bf16* tile, int n, int kk, uint32_t (&b)[4]) {
    LdMatrixX4(b,
               tile + (n + Lane() % 8 + Lane() / 16 * 8) * kStride + kk * 16 + Lane() / 8 % 2 * 8);
  }

 private:
  static constexpr int kPiecesPerRow = kBlockK / 8;
  static constexpr int kRowStep = kThreads / kPiecesPerRow;
  static constexpr int kPerThread = kRows / kRowStep;
  static_assert(kThreads % kPiecesPerRow == 0 && kRows % kRowStep == 0);

  __device__ static int FirstRow() { return static_cast<int>(threadIdx.x) / kPiecesPerRow; }
  __device__ static int Column() { return static_cast<int>(threadIdx.x) % kPiecesPerRow * 8; }

  const bf16* operand_;
  const bf16* src_[kPerThread];
  int depth_;
};

// kBlockK tile rows (reduction indices), each kCols values contiguous in memory: reduction
// index k of the tile's first column is at first + k * ld. Columns >= cols (a multiple of 8) and
// indices >= depth are zeros.
template <int kCols>
class MNMajorTile {
 public:
  static constexpr int kStride = kCols + 8;
  static constexpr int kElems = kBlockK * kStride;

  // `first` must be a valid address even when nothing is loaded (the unread source of zeros).
  __device__ MNMajorTile(const bf16* first, int64_t ld, int cols, int depth)
      : first_(first), ld_(ld), depth_(depth), column_valid_(Column() < cols) {}

  __device__ void Load(bf16* tile, int kt) const {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = FirstRow() + j * kRowStep;
      const int k = kt * kBlockK + r;
      const bool valid = column_valid_ && k < depth_;
      CpAsync16(tile + r * kStride + Column(), valid ? first_ + k * ld_ + Column() : first_, valid);
    }
  }

  // The A operand (16, 16) of tile columns [m, m + 16), reduction indices [16 kk, 16 kk + 16):
  // matrix i of the ldmatrix is reduction rows 8 (i / 2) .. + 8, columns m + 8 (i % 2) .. + 8.
  __device__ static void LoadA(const bf16* tile, int m, int kk, uint32_t (&a)[4]) {
    LdMatrixX4Trans(
        a, tile + (kk * 16 + Lane() / 16 * 8 + Lane() % 8) * kStride + m + Lane() / 8 % 2 * 8);
  }

  // B operands of tile columns [n, n + 8) in b[0], b[1] and [n + 8, n + 16) in b[2], b[3]:
  // matrix i is reduction rows 8 (i % 2) .. + 8, columns n + 8 (i / 2) .. + 8.
  __device__ static void LoadB(const bf16* tile, int n, int kk, uint32_t (&b)[4]) {
    LdMatrixX4Trans(
        b, tile + (kk * 16 + Lane() % 8 + Lane() / 8 % 2 * 8) * kStride + n + Lane() / 16 * 8);
  }

 private:
  static constexpr int kPiecesPerRow = kCols / 8;
  static constexpr int kRowStep = kThreads / kPiecesPerRow;
  static constexpr int kPerThread = kBlockK / kRowStep;
  static_assert(kThreads % kPiecesPerRow == 0 && kBlockK % kRowStep == 0);

  __device__ static int FirstRow() { return static_cast<int>(threadIdx.x) / kPiecesPerRow; }
  __device__ static int Column() { return static_cast<int>(threadIdx.x) % kPiecesPerRow * 8; }

  const bf16* first_;
  int64_t ld_;
  int depth_;
  bool column_valid_;
};

// Dynamic shared memory of a kernel multiplying ATile by BTile tiles.
template <typename ATile, typename BTile>
constexpr int SmemBytes() {
  return kStages * (ATile::kElems + BTile::kElems) * static_cast<int>(sizeof(bf16));
}

// acc = A · B over reduction indices [0, depth), A and B tiles filled by a.Load and b.Load.
// `smem` holds SmemBytes<ATile, BTile>().
template <typename ATile, typename BTile>
__device__ __forceinline__ void MultiplyTiles(const ATile& a, const BTile& b, int depth,
                                              unsigned char* smem, Accumulators& acc) {
  bf16* const sa = reinterpret_cast<bf16*>(smem);
  bf16* const sb = sa + kStages * ATile::kElems;
#pragma unroll
  for (int mi = 0; mi < kMmaTilesM; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kMmaTilesN; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    }
  }
  const int steps = (depth + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) {
      a.Load(sa + s * ATile::kElems, s);
      b.Load(sb + s * BTile::kElems, s);
    }
    CpAsyncCommit();  // one group per step, empty or not, so the wait below counts steps
  }
  const int m0 = WarpM() * kWarpTileM, n0 = WarpN() * kWarpTileN;
  for (int kt = 0; kt < steps; ++kt) {
    CpAsyncWait<kStages - 2>();  // step kt has landed (for this thread) ...
    __syncthreads();             // ... for all threads, and all are done with step kt - 1
    const int next = kt + kStages - 1;
    if (next < steps) {  // into the stage step kt - 1 used
      a.Load(sa + next % kStages * ATile::kElems, next);
      b.Load(sb + next % kStages * BTile::kElems, next);
    }
    CpAsyncCommit();
    const bf16* const ta = sa + kt % kStages * ATile::kElems;
    const bf16* const tb = sb + kt % kStages * BTile::kElems;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      uint32_t fa[kMmaTilesM][4];
#pragma unroll
      for (int mi = 0; mi < kMmaTilesM; ++mi) ATile::LoadA(ta, m0 + mi * 16, kk, fa[mi]);
#pragma unroll
      for (int np = 0; np < kMmaTilesN / 2; ++np) {
        uint32_t fb[4];
        BTile::LoadB(tb, n0 + np * 16, kk, fb);
#pragma unroll
        for (int mi = 0; mi < kMmaTilesM; ++mi) {
          Mma(acc[mi][2 * np], fa[mi], fb[0], fb[1]);
          Mma(acc[mi][2 * np + 1], fa[mi], fb[2], fb[3]);
        }
      }
    }
  }
  CpAsyncWaitAll();  // only empty groups are left; nothing stays in flight past the loop
}

// ---------------------------------------------------------------- grouped row tiles

// The group row ranges a kernel reads: offsets (groups + 1) in device memory.
struct GroupedRows {
  const int32_t* offsets;
  int groups;
  int rows;
};

// Row tiles to launch for `rows` rows in `groups` groups: sum_g ceil(rows_g / kBlockM) is at
// most (rows + groups * (kBlockM - 1)) / kBlockM.
inline int64_t RowTileBound(int64_t rows, int64_t groups) {
  return (rows + groups * (kBlockM - 1)) / kBlockM;
}

struct TileIndex {
  int row, col;
};

// Block `block` of row_tiles x col_tiles, in bands of kBandRows row tiles: within a band,
// consecutive blocks take consecutive row tiles of one column tile, so the blocks resident
// together read a few row tiles and a few column tiles.
__device__ __forceinline__ TileIndex BandedTile(int block, int row_tiles, int col_tiles) {
  const int band = block / (kBandRows * col_tiles);
  const int first = band * kBandRows;
  const int height = min(kBandRows, row_tiles - first);
  const int in_band = block - first * col_tiles;
  return {first + in_band % height, in_band / height};
}

struct RowTile {
  int group;       // -1: past the last tile
  int begin, end;  // rows [begin, end), at most kBlockM, all in the group
};

// The rows [tile.begin, tile.end) of a row-major (rows, width) operand as a K-major A tile.
__device__ __forceinline__ KMajorTile<kBlockM> TokenRows(const bf16* x, int width,
                                                         const RowTile& tile) {
  return KMajorTile<kBlockM>(
      x,
      [&](int i) -> const bf16* {
        return tile.begin + i < tile.end ? x + static_cast<int64_t>(tile.begin + i) * width
                                         : nullptr;
      },
      width);
}

// Row tile number `tile` of the sequence that covers group 0's rows in kBlockM-row tiles, then
// group 1's, and so on; every thread gets the same answer. `offsets` (groups + 1) is checked on
// the way: 0 = offsets[0] <= ... <= offsets[groups] = rows.
__device__ __forceinline__ RowTile FindRowTile(const int32_t* offsets, int groups, int rows,
                                               int tile) {
  __shared__ int warp_counts[kThreads / 32];
  __shared__ RowTile found;
  const int lane = Lane(), warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x == 0) {
    DEVICE_CHECK(offsets[0] == 0 && offsets[groups] == rows);
    found.group = -1;
  }
  int before = 0;  // tiles of the groups of earlier chunks
  for (int chunk = 0; chunk < groups; chunk += kThreads) {
    const int g = chunk + static_cast<int>(threadIdx.x);
    int begin = 0, end = 0;
    if (g < groups) {
      begin = offsets[g];
      end = offsets[g + 1];
      DEVICE_CHECK(begin <= end);
    }
    const int count = (end - begin + kBlockM - 1) / kBlockM;
    int inclusive = count;  // scan over the warp, then over the warps before this one
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += v;
    }
    if (lane == 31) warp_counts[warp] = inclusive;
    __syncthreads();  // also orders thread 0's initialisation of `found` before any match
    int chunk_total = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) inclusive += warp_counts[w];
      chunk_total += warp_counts[w];
    }
    const int first = before + inclusive - count;  // group g's first tile
    if (tile >= first && tile < first + count) {   // true for at most one thread
      const int row0 = begin + (tile - first) * kBlockM;
      found = {g, row0, min(end, row0 + kBlockM)};
    }
    before += chunk_total;
    __syncthreads();  // warp_counts is free for the next chunk; `found` is final after the last
  }
  return found;
}

// ---------------------------------------------------------------- host

// A size as the kernels' int; CHECKs that it fits.
inline int Int(int64_t value) {
  CHECK(value >= 0 && value <= INT_MAX) << "grouped GEMM size out of range: " << value;
  return static_cast<int>(value);
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline GroupedRows MakeGroupedRows(const Tensor& offsets, int64_t rows) {
  // FindRowTile's row arithmetic stays below INT_MAX.
  CHECK_LT(rows, int64_t{1} << 30) << "grouped GEMM: too many rows";
  return {Ptr<const int32_t>(offsets), Int(offsets.numel() - 1), Int(rows)};
}

// kernel<<<grid, kThreads, smem_bytes, stream>>>(args...), allowing that much dynamic shared
// memory first.
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, int smem_bytes, cudaStream_t stream,
            Args&&... args) {
  CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(std::forward<Args>(args)...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda::grouped
