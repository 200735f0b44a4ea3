// CUDA QuantizeColumnTiles (contract: engine/kernels/op_declarations.inc; the layout's arithmetic
// in engine/kernels/fp8_scaling.h): the weight gradients' operands, grouped rows x (rows, k)
// transposed into q (k, Fp8ColumnTokens(groups, rows)) with one scale per 128-row tile of a group
// and column, and optionally x's 1 x 128 row tiles (QuantizeRowTiles' outputs) in the same pass;
// with an index the grouped rows are x's rows index[r], read in place (a permutation's gather).
// SwigluForwardQuantized and SwigluBackwardQuantized run the same kernel over SwiGLU's output or
// its input gradient, computed as they are read.
// One block of kTileThreads threads per (scale slot, 128 columns of k), a slot's column tiles in
// consecutive blocks, so that the tiles of the same rows run together; SwiGLU's gradient, where f
// is a multiple of 128, one block per (slot, 128 pairs) quantising dgate's and dup's tiles of those
// pairs from one reading of them and summing each row's dscale terms over them into a partial,
// which SumDscalePartials then adds up (otherwise the backward's dscale comes from SwigluBackward's
// own kernel, told not to store dh, and a dgate and a dup column may share a tile, and each
// tile's block reads its pairs). The slot's group is found by a search of each warp over g ->
// Fp8ColumnTileSlot(g, offsets[g], 0) (strictly increasing in g) on the device offsets, and its
// tile is t = slot - that (Fp8ColumnTileRows); a slot past its group's tiles writes zero scales and
// ends. Otherwise the tile (at most 128 x 128 elements, quantize_tile.cuh) is loaded once into
// registers, a quad of four consecutive elements a load where the rows allow it, several rows'
// loads in flight before any is used (LoadTile); its rows, each exactly one 1 x 128 row tile (the
// block's columns start at a multiple of 128), are quantised by their warp's maxes and stored 4
// bytes a lane; its columns' maxes meet in shared memory, and the tile quantised per column is
// staged transposed in shared memory and stored as rows of q from the tile's first token
// (Fp8ColumnStart: a multiple of 32, so whole 16-byte units, StoreAlignedTransposed), a group's
// last tile with zeros up to a multiple of 32 tokens. The same f32 operations as the CPU reference
// (Fp8ScalingOf, a max exact in any order, then the e4m3 rounding), so the bits agree.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/fp8/quantize_tile.cuh"
#include "engine/kernels/cuda/layers/swiglu_math.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda {
namespace {

// The last group g whose scale slots start at or before `slot`: Fp8ColumnTileSlot(g, offsets[g],
// 0) <= slot (it is 0 for g = 0). A used slot belongs to that group, since a group's tiles never
// reach the next group's first slot. The whole warp searches (every lane calls it and gets the
// answer): each round its lanes test 32 evenly spaced groups of the range at once and keep the
// stretch after the last that passes, so 1024 groups take two rounds of loads instead of a binary
// search's ten.
__device__ __forceinline__ int64_t GroupOfSlot(const int32_t* offsets, int64_t groups,
                                               int64_t slot) {
  const int lane = threadIdx.x % 32;
  int64_t lo = 0, hi = groups;  // the answer lies in [lo, hi), and lo passes
  while (hi - lo > 1) {
    const int64_t step = (hi - lo + 31) / 32, g = lo + lane * step;
    const bool passes = g < hi && Fp8ColumnTileSlot(g, offsets[g], 0) <= slot;
    const int last = 31 - __clz(__ballot_sync(0xffffffffu, passes));  // lane 0's g = lo passes
    lo += last * step;
    hi = min(hi, lo + step);
  }
  return lo;
}

// The rows of SwigluForward(h, scale)'s output (rows, f), each value rounded to T as that op
// stores it (SwigluValue, then FromFloat), computed as they are read (LoadTile's source: a row's
// gate and up quads and its scale fetched, then combined).
template <typename T>
struct SwigluRows {
  using Element = T;
  static constexpr int kFetchRows = 2;       // 5 registers a row in flight (bf16)
  static constexpr bool kUnclamped = false;  // LoadTile always clamped (unclamped: spills)
  struct Fetched {
    Quad<T> gate, up;
    float scale;
  };
  using Finished = Quad<T>;
  const T* h;          // (rows, 2f) = [gate | up]
  const float* scale;  // (rows) or null
  int64_t f;
  bool vector;  // QuadRows(h, f)

  __device__ int64_t Locate(int64_t r) const { return r; }
  __device__ bool Valid(int64_t) const { return true; }
  template <bool kVector>
  __device__ Fetched Fetch(int64_t r, int64_t column, int n) const {
    const T* const gate = h + r * 2 * f + column;
    return {FetchQuad<kVector>(gate, n), FetchQuad<kVector>(gate + f, n),
            scale != nullptr ? scale[r] : 1.0f};
  }
  __device__ Quad<T> Finish(const Fetched& in, int64_t, int n) const {
    Quad<T> quad;
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) {
      if (j < n) quad.Put(j, FromFloat<T>(SwigluValue(in.gate.Get(j), in.up.Get(j), in.scale)));
    }
    return quad;
  }
};

// The rows of SwigluBackward's dh (rows, 2f) = [dgate | dup] from da (rows, f) and h, each value
// rounded to T as that op stores it (SwigluGradients, then FromFloat), computed as they are read
// (each (gate, up) pair's gradients twice: once for its dgate column, once for its dup column).
// A quad of columns lies in one half where kVector (f a multiple of 4); otherwise each column is
// read on its own.
template <typename T>
struct SwigluGradientRows {
  using Element = T;
  static constexpr int kFetchRows = 2;       // 7 registers a row in flight (bf16)
  static constexpr bool kUnclamped = false;  // LoadTile always clamped (unclamped: spills)
  struct Fetched {
    Quad<T> gate, up, da;
    float scale;
  };
  using Finished = Quad<T>;
  const T* da;
  const T* h;
  const float* scale;  // (rows) or null
  int64_t f;
  bool vector;  // QuadRows(h, f) && QuadRows(da, f)

  __device__ int64_t Locate(int64_t r) const { return r; }
  __device__ bool Valid(int64_t) const { return true; }
  // The pair of dh's column `column` (< 2f).
  __device__ int64_t Pair(int64_t column) const { return column < f ? column : column - f; }
  template <bool kVector>
  __device__ Fetched Fetch(int64_t r, int64_t column, int n) const {
    const T* const gate = h + r * 2 * f;
    const T* const d = da + r * f;
    Fetched in;
    in.scale = scale != nullptr ? scale[r] : 1.0f;
    if constexpr (kVector) {  // the quad's pairs j .. j + 3 of one half
      const int64_t j = Pair(column);
      in.gate = FetchQuad<true>(gate + j, n);
      in.up = FetchQuad<true>(gate + f + j, n);
      in.da = FetchQuad<true>(d + j, n);
    } else {
#pragma unroll
      for (int e = 0; e < kTileColsPerLane; ++e) {
        const int64_t j = Pair(column + e);
        if (e < n) {
          in.gate.Put(e, gate[j]);
          in.up.Put(e, gate[f + j]);
          in.da.Put(e, d[j]);
        }
      }
    }
    return in;
  }
  __device__ Quad<T> Finish(const Fetched& in, int64_t column, int n) const {
    Quad<T> quad;
#pragma unroll
    for (int e = 0; e < kTileColsPerLane; ++e) {
      const SwigluGradient grad =
          SwigluGradients(in.gate.Get(e), in.up.Get(e), in.scale, in.da.Get(e));
      if (e < n) quad.Put(e, FromFloat<T>(column + e < f ? grad.gate : grad.up));
    }
    return quad;
  }
};

// dh's dgate and dup columns of the same pairs at once (f a multiple of kFp8TileSize, so that the
// pairs' column tiles are dgate's and dup's): SwigluGradientRows' reading of the pairs (columns <
// f), each row's gradients computed once, into a GradientSlices; with dscale_partials (tiles(f),
// rows), each row's terms of dscale (silu(gate) up da) over a tile's pairs summed into its
// partial: a lane's quad in order, then the lanes in order (GradientSlices::SumDscaleTerms).
template <typename T>
struct SwigluGradientPairs : SwigluGradientRows<T> {
  float* dscale_partials;  // or null

  struct Finished {
    Quad<T> dgate, dup;
    float dscale_term;  // the sum of the quad's dscale terms
  };
  __device__ Finished Finish(const typename SwigluGradientRows<T>::Fetched& in, int64_t,
                             int n) const {
    Finished out{};
#pragma unroll
    for (int e = 0; e < kTileColsPerLane; ++e) {
      const SwigluGradient grad =
          SwigluGradients(in.gate.Get(e), in.up.Get(e), in.scale, in.da.Get(e));
      if (e < n) {
        out.dgate.Put(e, FromFloat<T>(grad.gate));
        out.dup.Put(e, FromFloat<T>(grad.up));
        out.dscale_term += grad.product;
      }
    }
    return out;
  }
};

// The dgate and dup tiles of the same pairs (LoadTile's slice for SwigluGradientPairs), and each
// lane's dscale terms of its warp's rows in shared memory, terms[warp][row][lane] (a row padded
// to 33 words, so that a lane reading a row's terms and a warp writing a row's hit distinct banks).
template <typename T>
struct GradientSlices {
  using DscaleTerms = float[kTileWarps][kTileRowsPerWarp][33];
  TileSlice<T> dgate, dup;
  DscaleTerms& terms;

  __device__ void Set(int i, const typename SwigluGradientPairs<T>::Finished& quads) {
    dgate.Set(i, quads.dgate);
    dup.Set(i, quads.dup);
    terms[threadIdx.x / 32][i][threadIdx.x % 32] = quads.dscale_term;
  }
  // partials[row] = the sum over the lanes in order of row r0 + row's terms, for the warp's rows
  // below `rows` (every lane of the warp calls it, after Set).
  __device__ void SumDscaleTerms(int64_t r0, int rows, float* partials) const {
    __syncwarp();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row = kTileRowsPerWarp * warp + lane;
    if (lane >= kTileRowsPerWarp || row >= rows) return;
    float sum = 0.0f;
#pragma unroll
    for (int l = 0; l < 32; ++l) sum += terms[warp][lane][l];
    partials[r0 + row] = sum;
  }
};

// What the column-tile kernels write for grouped rows (rows, k): q (k, tokens = Fp8ColumnTokens(
// groups, rows), 16-byte aligned) and scales (slots, k), null without the column tiles; row_q
// (rows, k) and row_scales (rows, tiles(k)), null without the row tiles; row_q's rows take 4-byte
// stores where `vector`.
struct ColumnTileOutputs {
  __nv_fp8_storage_t* q;
  float* scales;
  __nv_fp8_storage_t* row_q;
  float* row_scales;
  int64_t rows, k, tokens;
  bool vector;
};

// Scale slot `slot`'s tile: its rows (empty when no tile uses the slot) and where its first row
// lies in q's transposed rows.
struct SlotTile {
  Fp8RowRange rows;
  int64_t token;
};
__device__ __forceinline__ SlotTile FindSlotTile(const int32_t* offsets, int64_t groups,
                                                 int64_t rows, int64_t slot) {
  const int64_t group = GroupOfSlot(offsets, groups, slot);
  const int64_t begin = offsets[group], end = offsets[group + 1];
  MOE_DEVICE_CHECK(0 <= begin && begin <= end && end <= rows);
  const Fp8RowRange tile = Fp8ColumnTileRows(begin, end, slot - Fp8ColumnTileSlot(group, begin, 0));
  return {tile, Fp8ColumnToken(group, begin, tile.begin)};
}

// An unused slot's scales of column tile `column_tile`: zeros.
__device__ __forceinline__ void ZeroSlotScales(const ColumnTileOutputs& out, int64_t slot,
                                               int64_t column_tile) {
  const int64_t c0 = column_tile * kFp8TileSize;
  if (out.scales != nullptr && threadIdx.x < min(out.k - c0, kFp8TileSize)) {
    out.scales[slot * out.k + c0 + threadIdx.x] = 0.0f;
  }
}

// The loaded tile of slot `slot` and column tile `column_tile` into the outputs: its rows, each
// exactly one 1 x 128 row tile, by their warp's maxes; its columns' maxes meet in shared memory,
// and the tile quantised per column is staged transposed and stored as rows of q, with zeros up to
// a multiple of kFp8ColumnAlignment tokens. Every thread of the block calls it; a block may call it
// again for another tile (the barriers inside keep the shared arrays' uses apart).
template <typename Slice>
__device__ __forceinline__ void QuantizeLoadedTile(const Slice& slice, const SlotTile& slot_tile,
                                                   int64_t slot, int64_t column_tile,
                                                   const ColumnTileOutputs& out) {
  const Fp8RowRange tile = slot_tile.rows;
  const int64_t k = out.k, row_tiles = Fp8Tiles(k), r0 = tile.begin;
  const int64_t c0 = column_tile * kFp8TileSize;
  const int cols = static_cast<int>(min(k - c0, kFp8TileSize));
  const int tile_rows = static_cast<int>(tile.end - r0);
  if (out.row_q != nullptr) {
    QuantizeSliceRows(slice, tile_rows, cols, out.vector, out.row_q + r0 * k + c0, k,
                      out.row_scales + r0 * row_tiles + column_tile, row_tiles);
  }
  if (out.q == nullptr) return;  // block-uniform

  // Lane l's columns' maxes over warp w's rows: warp_amax[w][4 l + j].
  __shared__ __align__(16) float warp_amax[kTileWarps][kFp8TileSize];
  __shared__ __align__(16) float multipliers[kFp8TileSize];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float amax[kTileColsPerLane];
  slice.ColumnAmax(amax);
  reinterpret_cast<float4*>(warp_amax[warp])[lane] =
      make_float4(amax[0], amax[1], amax[2], amax[3]);
  __syncthreads();
  if (threadIdx.x < kFp8TileSize) {
    const int c = threadIdx.x;
    float column_amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) column_amax = fmaxf(column_amax, warp_amax[w][c]);
    const Fp8TileScaling scaling = Fp8ScalingOf(column_amax);
    multipliers[c] = scaling.multiplier;
    if (c < cols) out.scales[slot * k + c0 + c] = scaling.scale;
  }
  __syncthreads();
  __shared__ StagedTile staged;
  StageTransposed(
      slice, [&](int c) { return multipliers[c]; }, staged);
  __syncthreads();
  const int width = static_cast<int>(Fp8ColumnAligned(tile_rows));  // staged rows past: zeros
  StoreAlignedTransposed(staged, cols, width, out.q + c0 * out.tokens + slot_tile.token,
                         out.tokens);
}

// Block b = (slot, column tile) = (b / tiles(k), b % tiles(k)), kTileThreads threads, over the
// grouped rows (out.rows, out.k) that `source` reads (LoadTile's form).
template <typename Source>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm<typename Source::Element>)
    QuantizeColumnTilesKernel(Source source, const int32_t* offsets, int64_t groups,
                              ColumnTileOutputs out) {
  const int64_t row_tiles = Fp8Tiles(out.k);  // a row's tiles: the column tiles of a slot
  const int64_t slot = blockIdx.x / row_tiles, column_tile = blockIdx.x % row_tiles;
  const SlotTile tile = FindSlotTile(offsets, groups, out.rows, slot);
  if (tile.rows.begin >= tile.rows.end) {  // block-uniform
    ZeroSlotScales(out, slot, column_tile);
    return;
  }
  const int64_t c0 = column_tile * kFp8TileSize;
  TileSlice<typename Source::Element> slice;
  LoadTile(source, tile.rows.begin, c0, static_cast<int>(tile.rows.end - tile.rows.begin),
           static_cast<int>(min(out.k - c0, kFp8TileSize)), slice);
  QuantizeLoadedTile(slice, tile, slot, column_tile, out);
}

// Block b = (slot, pair tile t) = (b / tiles(f), b % tiles(f)) of SwiGLU's gradient dh (out.k =
// 2f, f a multiple of kFp8TileSize): dh's column tiles t (dgate) and tiles(f) + t (dup) from one
// reading of their pairs. Two tiles in registers: half the blocks an SM of the one-tile kernel.
template <typename T>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm<T> / 2)
    QuantizeSwigluGradientPairsKernel(SwigluGradientPairs<T> source, const int32_t* offsets,
                                      int64_t groups, ColumnTileOutputs out) {
  const int64_t pair_tiles = Fp8Tiles(out.k) / 2;
  const int64_t slot = blockIdx.x / pair_tiles, pair_tile = blockIdx.x % pair_tiles;
  const SlotTile tile = FindSlotTile(offsets, groups, out.rows, slot);
  if (tile.rows.begin >= tile.rows.end) {  // block-uniform
    ZeroSlotScales(out, slot, pair_tile);
    ZeroSlotScales(out, slot, pair_tiles + pair_tile);
    return;
  }
  __shared__ typename GradientSlices<T>::DscaleTerms terms;
  GradientSlices<T> slices{.terms = terms};
  const int tile_rows = static_cast<int>(tile.rows.end - tile.rows.begin);
  LoadTile(source, tile.rows.begin, pair_tile * kFp8TileSize, tile_rows, kFp8TileSize, slices);
  if (source.dscale_partials != nullptr) {
    slices.SumDscaleTerms(tile.rows.begin, tile_rows,
                          source.dscale_partials + pair_tile * out.rows);
  }
  QuantizeLoadedTile(slices.dgate, tile, slot, pair_tile, out);
  QuantizeLoadedTile(slices.dup, tile, slot, pair_tiles + pair_tile, out);
}

// Launches kernel(source, offsets, groups, outputs) over `rows` grouped rows of width k, a block
// per scale slot and each of its `slot_blocks` blocks, into the defined outputs.
template <typename Source, typename Kernel>
void LaunchColumnTiles(Kernel kernel, const Source& source, int64_t slot_blocks, int64_t rows,
                       int64_t k, const Tensor& offsets, const Tensor& q, const Tensor& scales,
                       const Tensor& row_q, const Tensor& row_scales, cudaStream_t stream) {
  const int64_t groups = offsets.numel() - 1;
  CHECK(groups >= 1 || rows == 0) << "fp8 column-tile quantisation of " << rows
                                  << " rows in no group";
  const int64_t slots = Fp8ColumnTileSlots(groups, rows);
  if (slots == 0 || slot_blocks == 0) return;
  CHECK(slots * slot_blocks <= INT32_MAX) << "fp8 column-tile quantisation grid of " << slots
                                          << " slots x " << slot_blocks << " blocks";
  const auto row_q_data = Ptr<__nv_fp8_storage_t>(row_q);
  const auto q_data = Ptr<__nv_fp8_storage_t>(q);
  CHECK(reinterpret_cast<uintptr_t>(q_data) % 16 == 0) << "fp8 column tiles need q 16-byte aligned";
  const ColumnTileOutputs out{q_data,
                              Ptr<float>(scales),
                              row_q_data,
                              Ptr<float>(row_scales),
                              rows,
                              k,
                              Fp8ColumnTokens(groups, rows),
                              source.vector && QuadRows(row_q_data, k)};
  kernel<<<static_cast<unsigned>(slots * slot_blocks), kTileThreads, 0, stream>>>(
      source, Ptr<const int32_t>(offsets), groups, out);
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void QuantizeColumnTiles(const Tensor& x, const Tensor& offsets, const Tensor& q,
                         const Tensor& scales, const Tensor& row_q, const Tensor& row_scales,
                         const Tensor& index) {
  const int64_t rows = index.defined() ? index.dim(0) : x.dim(0), k = x.dim(1);
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    const MatrixRows<T> source{
        Ptr<const T>(x), SourceInt(x.dim(0), "rows"), Ptr<const int32_t>(index),
        SourceInt(k * int64_t{sizeof(T)}, "row bytes"), QuadRows(Ptr<const T>(x), k)};
    LaunchColumnTiles(QuantizeColumnTilesKernel<MatrixRows<T>>, source, Fp8Tiles(k), rows, k,
                      offsets, q, scales, row_q, row_scales, StreamOf(x));
  });
}

void SwigluForwardQuantized(const Tensor& h, const Tensor& scale, const Tensor& offsets,
                            const Tensor& q, const Tensor& scales, const Tensor& row_q,
                            const Tensor& row_scales) {
  const int64_t rows = h.dim(0), f = h.dim(1) / 2;
  DispatchFloat(h.dtype(), [&]<typename T>(TypeTag<T>) {
    const SwigluRows<T> source{Ptr<const T>(h), Ptr<const float>(scale), f,
                               QuadRows(Ptr<const T>(h), f)};
    LaunchColumnTiles(QuantizeColumnTilesKernel<SwigluRows<T>>, source, Fp8Tiles(f), rows, f,
                      offsets, q, scales, row_q, row_scales, StreamOf(h));
  });
}

void SwigluBackwardQuantized(const Tensor& da, const Tensor& h, const Tensor& scale,
                             const Tensor& offsets, const Tensor& q, const Tensor& scales,
                             const Tensor& row_q, const Tensor& row_scales, const Tensor& dscale) {
  const int64_t rows = h.dim(0), f = da.dim(1);
  DispatchFloat(h.dtype(), [&]<typename T>(TypeTag<T>) {
    const SwigluGradientRows<T> source{
        Ptr<const T>(da), Ptr<const T>(h), Ptr<const float>(scale), f,
        QuadRows(Ptr<const T>(h), f) && QuadRows(Ptr<const T>(da), f)};
    if (f % kFp8TileSize == 0) {  // dgate's and dup's tiles of the same pairs in one block
      const bool sums = dscale.defined() && rows > 0;
      const Tensor partials =
          sums ? Tensor::Empty({Fp8Tiles(f), rows}, DType::kF32, h.device()) : Tensor();
      LaunchColumnTiles(QuantizeSwigluGradientPairsKernel<T>,
                        SwigluGradientPairs<T>{source, Ptr<float>(partials)}, Fp8Tiles(f), rows,
                        2 * f, offsets, q, scales, row_q, row_scales, StreamOf(h));
      if (sums) {
        MOE_CUDA_CALL(SumDscalePartials(Ptr<float>(partials), Fp8Tiles(f), rows, Ptr<float>(dscale),
                                        StreamOf(h)));
      }
    } else {
      SwigluBackward(da, h, scale, Tensor(), dscale);  // dscale alone, as SwigluBackward sums it
      LaunchColumnTiles(QuantizeColumnTilesKernel<SwigluGradientRows<T>>, source, Fp8Tiles(2 * f),
                        rows, 2 * f, offsets, q, scales, row_q, row_scales, StreamOf(h));
    }
  });
}

}  // namespace moe::cuda
