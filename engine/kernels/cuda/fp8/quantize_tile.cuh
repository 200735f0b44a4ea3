// The pieces of the FP8 kernels that quantise a tile of at most kFp8TileSize x kFp8TileSize
// elements with one block of kTileThreads threads (include only from .cu files):
//   TileSlice / LoadTile: the tile in the block's registers, warp w holding the tile's rows
//     kTileRowsPerWarp w + i, lane l their columns kTileColsPerLane l + j: a quad of four
//     consecutive elements a row, read by one 8- or 16-byte load where the rows allow it
//     (QuadRows; otherwise element by element), wherever each row lies, or computed as it is read
//     (a gather reads in place, SwiGLU's output is never stored); elements outside the tile read
//     as 0 (no amax changes). A lane issues the loads of several rows before it uses any of their
//     values (LoadTileRows: how a source splits the reading of a row; a warp whose rows all lie
//     in the tile reads them unclamped, with no per-row test). bf16 values are held
//     two to a register, and their maxes taken two at a time, without unpacking them.
//   QuantizeSliceRows: each row quantised as a 1 x 128 row tile: the rows' maxes by a butterfly
//     that halves the warp's 16 rows at each of four shuffles, then a lane's quad as one 4-byte
//     store (a warp stores a row's 128 bytes at once; StoreSliceRows, which steps one pointer a
//     row, the block kernels' rows too).
//   StagedTile / StageTransposed / StoreTransposed: the quantised tile transposed through shared
//     memory: a lane stages a column's 16 bytes of its warp's rows at once (16-byte chunks
//     swizzled by the column, so that the 8 lanes of a phase hit all 32 banks), and ten lanes store
//     a transposed row as aligned 16-byte units wherever it starts (byte by byte at its two ends
//     only, a thread each); StoreAlignedTransposed where every row starts on a 16-byte boundary
//     (the column tiles'), a chunk a store.
// Quantisation is e4m3(x * multiplier): one f32 multiplication, then the device's
// cvt.rn.satfinite e4m3 (what FloatToE4M3 emulates on the host; ToE4M3x4).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/fp8_scaling.h"

namespace moe::cuda {

constexpr int kTileWarps = 8;
constexpr int kTileThreads = 32 * kTileWarps;
constexpr int kTileRowsPerWarp = kFp8TileSize / kTileWarps;
constexpr int kTileColsPerLane = 4;
static_assert(32 * kTileColsPerLane == kFp8TileSize, "a warp's quads cover a row of a tile");
static_assert(kTileRowsPerWarp == 16, "SliceRowScaling halves a warp's rows four times");

// Whether rows of `row_elements` elements of T from p on can be read a quad at a time (each quad
// aligned to its four elements' bytes).
template <typename T>
bool QuadRows(const T* p, int64_t row_elements) {
  return row_elements % kTileColsPerLane == 0 &&
         reinterpret_cast<uintptr_t>(p) % (kTileColsPerLane * sizeof(T)) == 0;
}

// Element j % 2 of a pair of bf16 values in one word (element 0 in the low half), as f32.
__device__ __forceinline__ float PairElement(uint32_t pair, int j) {
  return __uint_as_float(j % 2 == 0 ? pair << 16 : pair & 0xffff0000u);
}

// A quad of four consecutive elements of T as stored, in 32-bit words (bf16 two a word, element
// 2 p in word p's low half), so that a bf16 quad takes two registers; zeros unless set.
template <typename T>
struct Quad {
  static constexpr int kWords = static_cast<int>(sizeof(T)) * kTileColsPerLane / 4;
  uint32_t words[kWords] = {};

  __device__ float Get(int j) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(words[j]);
    } else {
      return PairElement(words[j / 2], j);
    }
  }
  __device__ void Put(int j, T value) {
    if constexpr (sizeof(T) == 4) {
      words[j] = __float_as_uint(value);
    } else {
      const uint32_t bits = __bfloat16_as_ushort(value), word = words[j / 2];
      words[j / 2] = j % 2 == 0 ? (word & 0xffff0000u) | bits : (word & 0xffffu) | bits << 16;
    }
  }
};

// p[0..4) by one load where kVector (p aligned as QuadRows says), else p[j] for j < n and 0 past
// it, element by element (no load at all for n <= 0).
template <bool kVector, typename T>
__device__ __forceinline__ Quad<T> FetchQuad(const T* p, int n) {
  constexpr int kWords = Quad<T>::kWords;
  Quad<T> quad;
  if constexpr (kVector) {
    const Packed<uint32_t, kWords> loaded = *reinterpret_cast<const Packed<uint32_t, kWords>*>(p);
#pragma unroll
    for (int w = 0; w < kWords; ++w) quad.words[w] = loaded.v[w];
  } else {
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) {
      if (j < n) quad.Put(j, p[j]);
    }
  }
  return quad;
}

// The e4m3 bytes of a, b, c and d (cvt.rn.satfinite, two at a time), in that order from the low
// byte.
__device__ __forceinline__ uint32_t ToE4M3x4(float a, float b, float c, float d) {
  const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return low | high << 16;
}

// A thread's elements of a tile (element (kTileRowsPerWarp warp + i, kTileColsPerLane lane + j)
// is Get(i, j)), of inputs of type T: f32 values as they are; bf16 values (every value a bf16
// kernel loads or computes is one, rounded as its op stores it) two to a register, so that a tile
// needs half the registers and more tiles fit on a multiprocessor.
template <typename T>
struct TileSlice {
  float v[kTileRowsPerWarp][kTileColsPerLane];

  __device__ float Get(int i, int j) const { return v[i][j]; }
  __device__ void Set(int i, const Quad<T>& quad) {
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) v[i][j] = quad.Get(j);
  }
  // The largest magnitude of row i's elements (0 if none; NaN skipped, as fmaxf does).
  __device__ float RowAmax(int i) const {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) amax = fmaxf(amax, fabsf(v[i][j]));
    return amax;
  }
  // amax[j] = the largest magnitude of column j's elements.
  __device__ void ColumnAmax(float (&amax)[kTileColsPerLane]) const {
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) {
      amax[j] = 0.0f;
#pragma unroll
      for (int i = 0; i < kTileRowsPerWarp; ++i) amax[j] = fmaxf(amax[j], fabsf(v[i][j]));
    }
  }
};
template <>
struct TileSlice<bf16> {
  uint32_t pairs[kTileRowsPerWarp][kTileColsPerLane / 2];  // (j even) | (j odd) << 16, as bf16

  __device__ float Get(int i, int j) const { return PairElement(pairs[i][j / 2], j); }
  __device__ void Set(int i, const Quad<bf16>& quad) {  // its words as they are
    pairs[i][0] = quad.words[0];
    pairs[i][1] = quad.words[1];
  }
  // The maxes in bf16 pairs (a max of bf16 values is one of them, so exact; NaN skipped as fmaxf
  // skips it), both halves of a pair at once.
  __device__ float RowAmax(int i) const {
    const __nv_bfloat162 amax = __hmax2(Magnitudes(pairs[i][0]), Magnitudes(pairs[i][1]));
    return fmaxf(__low2float(amax), __high2float(amax));
  }
  __device__ void ColumnAmax(float (&amax)[kTileColsPerLane]) const {
#pragma unroll
    for (int p = 0; p < kTileColsPerLane / 2; ++p) {
      __nv_bfloat162 pair_amax = Magnitudes(pairs[0][p]);
#pragma unroll
      for (int i = 1; i < kTileRowsPerWarp; ++i) {
        pair_amax = __hmax2(pair_amax, Magnitudes(pairs[i][p]));
      }
      amax[2 * p] = __low2float(pair_amax);
      amax[2 * p + 1] = __high2float(pair_amax);
    }
  }

 private:
  // |a| and |b| of a pair: their sign bits cleared.
  __device__ static __nv_bfloat162 Magnitudes(uint32_t pair) {
    const uint32_t magnitudes = pair & 0x7fff7fffu;
    return *reinterpret_cast<const __nv_bfloat162*>(&magnitudes);
  }
};

// The blocks of kTileThreads threads a multiprocessor holds at once (the tile kernels' launch
// bounds): four where a tile's values take two to a register (64 registers a thread: the column
// kernels fit without spilling, QuantizeBlocks spills 16 bytes and is still faster than with
// three), two for f32 tiles.
template <typename T>
constexpr int kTileBlocksPerSm = std::is_same_v<T, bf16> ? 4 : 2;

// v (a row count or width) as an int: CHECKs that it fits.
inline int SourceInt(int64_t v, const char* what) {
  CHECK(0 <= v && v <= INT32_MAX) << "fp8 quantisation: " << what << " " << v << " past 2^31";
  return static_cast<int>(v);
}

// The rows of a matrix (`rows` rows of row_bytes bytes from x), or with an index its rows
// index[r] (a permutation's gather, read in place): a source of LoadTile. Its rows and row bytes
// are ints (the launchers CHECK that they fit, "row bytes": k sizeof(T)), so that a row's address
// is one 32 x 32-bit product added to the quad's column (IMAD.WIDE), and a row's validity one
// unsigned comparison.
template <typename T>
struct MatrixRows {
  using Element = T;
  static constexpr int kFetchRows = kTileRowsPerWarp;  // loaded into the slice itself
  // LoadTile's unclamped form where it can: an index's loads from one address.
  static constexpr bool kUnclamped = true;
  using Fetched = Quad<T>;
  using Finished = Quad<T>;
  const T* x;
  int rows;
  const int32_t* index;  // or null
  int row_bytes;         // k sizeof(T)
  bool vector;           // QuadRows(x, k)

  __device__ int Locate(int64_t r) const {
    return index == nullptr ? static_cast<int>(r) : index[r];
  }
  __device__ bool Valid(int row) const {
    return static_cast<unsigned>(row) < static_cast<unsigned>(rows);
  }
  template <bool kVector>
  __device__ Fetched Fetch(int row, int64_t column, int n) const {
    const char* const at = reinterpret_cast<const char*>(x + column);  // the same for every row
    return FetchQuad<kVector>(reinterpret_cast<const T*>(at + int64_t{row} * row_bytes), n);
  }
  __device__ Quad<T> Finish(const Fetched& quad, int64_t, int) const { return quad; }
};

// LoadTile's rows of one lane, quads of kVector form at `column` (n of them inside the tile, as
// FetchQuad's): kFetchRows rows at a time, first each row's location (source.Locate: an index's
// loads in flight together), then each row's inputs (source.Fetch: their loads in flight
// together), then its values (source.Finish: a Source::Finished, which slice.Set takes), so that
// no load waits for a value loaded before it. kClamped (the rows may pass `rows`): a row past
// `rows` reads row rows - 1 and is set to 0, no branch among the loads; otherwise (LoadTile: the
// warp's rows all lie in the tile) no row is clamped or tested, so that an index's loads share one
// address (immediate offsets).
template <bool kVector, bool kClamped, typename Source, typename Slice>
__device__ __forceinline__ void LoadTileRows(const Source& source, int64_t r0, int64_t column,
                                             int rows, int n, Slice& slice) {
  constexpr int kBatch = Source::kFetchRows;
  static_assert(kTileRowsPerWarp % kBatch == 0);
  const int first = kTileRowsPerWarp * static_cast<int>(threadIdx.x / 32);
#pragma unroll
  for (int b = 0; b < kTileRowsPerWarp; b += kBatch) {
    decltype(source.Locate(r0)) located[kBatch];  // a source's row type
    bool valid = true;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int row = kClamped ? min(first + b + i, rows - 1) : first + b + i;
      located[i] = source.Locate(r0 + row);
      valid &= source.Valid(located[i]);  // no short circuit: no branch among the loads
    }
    MOE_DEVICE_CHECK(valid);  // one check (a call, which ptxas saves registers around) a batch
    typename Source::Fetched fetched[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      fetched[i] = source.template Fetch<kVector>(located[i], column, n);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      slice.Set(b + i, !kClamped || first + b + i < rows ? source.Finish(fetched[i], column, n)
                                                         : typename Source::Finished{});
    }
  }
}

// The tile of `rows` x `cols` elements (each in 1 .. kFp8TileSize) from row r0 and column c0 of
// what `source` reads (a MatrixRows, or a source of that form computing its values as it reads
// them), as f32 in the slice; rows past `rows` and columns past `cols` are 0. A lane's quads take
// one load each where source.vector and the quad lies wholly inside the tile, unclamped where
// Source::kUnclamped and the warp's rows all lie in the tile (warp-uniform; in a tile of 128 rows
// every warp), each form its own straight-line code. Element by element (the tile's right edge,
// or rows not quad-aligned) stays clamped: unclamped, the addresses of its 64 loads, computed at
// once, spill.
template <typename Source, typename Slice>
__device__ __forceinline__ void LoadTile(const Source& source, int64_t r0, int64_t c0, int rows,
                                         int cols, Slice& slice) {
  const int c = static_cast<int>(threadIdx.x % 32) * kTileColsPerLane, n = cols - c;
  const bool whole_rows = kTileRowsPerWarp * static_cast<int>(threadIdx.x / 32 + 1) <= rows;
  if (source.vector && n >= kTileColsPerLane) {
    if (Source::kUnclamped && whole_rows) {
      LoadTileRows<true, false>(source, r0, c0 + c, rows, n, slice);
    } else {
      LoadTileRows<true, true>(source, r0, c0 + c, rows, n, slice);
    }
  } else {
    LoadTileRows<false, true>(source, r0, c0 + c, rows, n, slice);
  }
}

// The scaling of slice row lane / 2 of the calling warp as a row tile (its max over the row's
// lanes; every lane of the warp calls it). At each shuffle a lane keeps the half of its remaining
// rows that bit (2 half) of its lane selects and takes its partner's maxes of them, so after four
// the lane holds row (lane / 2)'s max over its lane pair's columns; one more joins the pair.
template <typename Slice>
__device__ __forceinline__ Fp8TileScaling SliceRowScaling(const Slice& slice) {
  const int lane = threadIdx.x % 32;
  // Loops of constant trip counts (the inner one unrolls before the outer one's rounds are known)
  // and selections of values, not of addresses: every index a constant, so that the array lives
  // in registers, not in local memory.
  float amax[kTileRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kTileRowsPerWarp; ++i) amax[i] = slice.RowAmax(i);
#pragma unroll
  for (int round = 3; round >= 0; --round) {
    const int half = 1 << round;
    static_assert(kTileRowsPerWarp == 16, "four rounds");
    const bool upper = (lane & 2 * half) != 0;
#pragma unroll
    for (int i = 0; i < kTileRowsPerWarp / 2; ++i) {
      if (i >= half) break;
      const float low = amax[i], high = amax[i + half];  // values selected, not addresses
      const float keep = upper ? high : low;
      const float give = upper ? low : high;
      amax[i] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, give, 2 * half));
    }
  }
  return Fp8ScalingOf(fmaxf(amax[0], __shfl_xor_sync(0xffffffffu, amax[0], 1)));
}

// Slice row i's quad quantised with `multiplier` to out[0..n): one 4-byte store where kWhole (then
// n >= 4 and out 4-byte aligned) or where `vector` and n >= 4 (then out 4-byte aligned), else byte
// by byte (nothing for n <= 0).
template <bool kWhole, typename Slice>
__device__ __forceinline__ void StoreQuantizedQuad(const Slice& slice, int i, float multiplier,
                                                   int n, bool vector, __nv_fp8_storage_t* out) {
  const uint32_t bytes = ToE4M3x4(slice.Get(i, 0) * multiplier, slice.Get(i, 1) * multiplier,
                                  slice.Get(i, 2) * multiplier, slice.Get(i, 3) * multiplier);
  if constexpr (!kWhole) {
    if (!vector || n < kTileColsPerLane) {
#pragma unroll
      for (int j = 0; j < kTileColsPerLane; ++j) {
        if (j < n) out[j] = static_cast<__nv_fp8_storage_t>(bytes >> 8 * j);
      }
      return;
    }
  }
  *reinterpret_cast<uint32_t*>(out) = bytes;
}

// The slice's rows r < rows of the tile at q (its row r at q + r * ld, `cols` columns), row i of
// warp w quantised with multiplier(i) (every lane calls it for every i, so it may shuffle): a
// lane's quads from q + (kTileRowsPerWarp w) ld + its column on, one pointer stepped by ld a row.
// kWhole: every quad of the tile whole (4-byte stores, no test); otherwise StoreQuantizedQuad's
// choice by `vector` and the quad's columns.
template <bool kWhole, typename Slice, typename Multiplier>
__device__ __forceinline__ void StoreSliceRowsAs(const Slice& slice, Multiplier multiplier,
                                                 int rows, int cols, bool vector,
                                                 __nv_fp8_storage_t* q, int64_t ld) {
  const int warp = threadIdx.x / 32, c = static_cast<int>(threadIdx.x % 32) * kTileColsPerLane;
  const int warp_rows = rows - kTileRowsPerWarp * warp;  // of the warp's rows, those in the tile
  __nv_fp8_storage_t* out = q + kTileRowsPerWarp * warp * ld + c;
#pragma unroll
  for (int i = 0; i < kTileRowsPerWarp; ++i, out += ld) {
    const float m = multiplier(i);
    if (i < warp_rows) StoreQuantizedQuad<kWhole>(slice, i, m, cols - c, vector, out);
  }
}

// StoreSliceRowsAs, of the whole form where `vector` and the tile is kFp8TileSize columns wide
// (block-uniform), each form its own straight-line code.
template <typename Slice, typename Multiplier>
__device__ __forceinline__ void StoreSliceRows(const Slice& slice, Multiplier multiplier, int rows,
                                               int cols, bool vector, __nv_fp8_storage_t* q,
                                               int64_t ld) {
  if (vector && cols == kFp8TileSize) {
    StoreSliceRowsAs<true>(slice, multiplier, rows, cols, vector, q, ld);
  } else {
    StoreSliceRowsAs<false>(slice, multiplier, rows, cols, vector, q, ld);
  }
}

// The slice's rows r < rows, each a 1 x 128 row tile of `cols` columns: row r's bytes to
// q + r * ld, its scale to scales[r * scales_ld] (`vector`: q's rows take 4-byte stores). Every
// thread of the block calls it.
template <typename Slice>
__device__ __forceinline__ void QuantizeSliceRows(const Slice& slice, int rows, int cols,
                                                  bool vector, __nv_fp8_storage_t* q, int64_t ld,
                                                  float* scales, int64_t scales_ld) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Fp8TileScaling scaling = SliceRowScaling(slice);  // row lane / 2's
  const int own_row = kTileRowsPerWarp * warp + lane / 2;
  if (lane % 2 == 0 && own_row < rows) scales[own_row * scales_ld] = scaling.scale;
  StoreSliceRows(
      slice, [&](int i) { return __shfl_sync(0xffffffffu, scaling.multiplier, 2 * i); }, rows, cols,
      vector, q, ld);
}

// A quantised tile transposed: column c's bytes of rows 16 w .. 16 w + 15 (the rows of warp w)
// are chunk[c][w ^ (c / 4 % 8)] (a lane's four columns share the swizzle).
struct StagedTile {
  uint4 chunk[kFp8TileSize][kTileWarps];
};
static_assert(kTileWarps == 8 && sizeof(uint4) == kTileRowsPerWarp, "a chunk per warp's rows");

// Stages every element of the slice: element (r, c) as e4m3(element * multiplier(c)) (those
// outside the tile too: zeros). Synchronise before reading `staged`.
template <typename Slice, typename Multiplier>
__device__ __forceinline__ void StageTransposed(const Slice& slice, Multiplier multiplier,
                                                StagedTile& staged) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kTileColsPerLane; ++j) {
    const int c = lane * kTileColsPerLane + j;
    const float m = multiplier(c);
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      words[w] = ToE4M3x4(slice.Get(4 * w, j) * m, slice.Get(4 * w + 1, j) * m,
                          slice.Get(4 * w + 2, j) * m, slice.Get(4 * w + 3, j) * m);
    }
    staged.chunk[c][warp ^ lane % 8] = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// Chunk `index` of a staged column (its 8 chunks swizzled by `swizzle`), zeros outside them.
__device__ __forceinline__ uint4 StagedChunk(const uint4* column, int swizzle, int index) {
  return static_cast<unsigned>(index) < kTileWarps ? column[index ^ swizzle]
                                                   : make_uint4(0, 0, 0, 0);
}

// The 16 bytes of a staged column from byte 16 u - skew, skew = 4 kWords + bytes < 16, out of
// its chunks u - 1 and u (words[0..4) and words[4..8)): word i joins the last `bytes` bytes of
// words[3 - kWords + i] and the first 4 - bytes of the word after it.
template <int kWords>
__device__ __forceinline__ uint4 ShiftedUnit(const uint32_t (&words)[8], int bytes) {
  uint32_t unit[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unit[i] = __funnelshift_rc(words[3 - kWords + i], words[4 - kWords + i], 8 * (4 - bytes));
  }
  return make_uint4(unit[0], unit[1], unit[2], unit[3]);
}

// The 16 bytes of staged column c from its byte 16 u - skew (zeros outside its 128 bytes).
__device__ __forceinline__ uint4 StagedUnit(const StagedTile& staged, int c, int u, int skew) {
  const int swizzle = c / 4 % 8;
  const uint4 before = StagedChunk(staged.chunk[c], swizzle, u - 1);
  const uint4 at = StagedChunk(staged.chunk[c], swizzle, u);
  const uint32_t words[8] = {before.x, before.y, before.z, before.w, at.x, at.y, at.z, at.w};
  switch (skew / 4) {  // the word shift as a constant: no indexing of `words` at run time
    case 0:
      return ShiftedUnit<0>(words, skew % 4);
    case 1:
      return ShiftedUnit<1>(words, skew % 4);
    case 2:
      return ShiftedUnit<2>(words, skew % 4);
    default:
      return ShiftedUnit<3>(words, skew % 4);
  }
}

// For each column c < cols of the staged tile: out[c * ld + r] = its byte r for r < width (0 for
// r >= 128: padding past the tile; width <= kFp8TileSize + 15). Out's rows are cut into 16-byte
// units (aligned), unit u of column c holding its bytes from 16 u - skew (skew: where the column
// starts in its first unit). A unit wholly inside the column's width bytes is one 16-byte store:
// kUnitLanes lanes a column, a lane a unit, kUnitLanes units covering the widest column. The first
// and last units, which the column shares with its neighbours, are stored byte by byte, a thread
// each, after the whole units (so that no warp waits for a few lanes' byte stores).
constexpr int kUnitLanes = 10;
static_assert(16 * kUnitLanes >= 15 + kFp8TileSize + 15, "a column's units, skewed and padded");
__device__ __forceinline__ void StoreTransposed(const StagedTile& staged, int cols, int width,
                                                __nv_fp8_storage_t* out, int64_t ld) {
  constexpr int kColumnsPerWarp = 32 / kUnitLanes;
  MOE_DEVICE_CHECK(width <= kFp8TileSize + 15);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const auto skew_of = [&](int c) {
    return static_cast<int>(reinterpret_cast<uintptr_t>(out + c * ld) % 16);
  };
  if (lane < kColumnsPerWarp * kUnitLanes) {
    const int u = lane % kUnitLanes;
    for (int c = kColumnsPerWarp * warp + lane / kUnitLanes; c < cols;
         c += kColumnsPerWarp * kTileWarps) {
      const int skew = skew_of(c), first = 16 * u - skew;  // the unit's first byte in the column
      if (first < 0 || first + 16 > width) continue;       // an end unit, or none
      *reinterpret_cast<uint4*>(out + c * ld + first) = StagedUnit(staged, c, u, skew);
    }
  }
  static_assert(2 * kFp8TileSize <= kTileThreads, "a thread per end unit");
  const int c = threadIdx.x / 2;
  if (c >= cols) return;
  const int skew = skew_of(c);
  const int u = threadIdx.x % 2 == 0 ? 0 : (skew + width - 1) / 16, first = 16 * u - skew;
  if ((first >= 0 && first + 16 <= width) || (u == 0 && threadIdx.x % 2 == 1)) return;
  const uint4 unit = StagedUnit(staged, c, u, skew);
  const uint32_t words[4] = {unit.x, unit.y, unit.z, unit.w};
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    const int r = first + b;
    if (0 <= r && r < width) {
      out[c * ld + r] = static_cast<__nv_fp8_storage_t>(words[b / 4] >> 8 * (b % 4));
    }
  }
}

// StoreTransposed where every column starts on a 16-byte boundary (out and ld multiples of 16)
// and width is a multiple of 16 up to kFp8TileSize (no end units, no skew): each of the cols x
// width / 16 units is one 16-byte store of its chunk. Thread t takes unit t % 8 of columns t / 8 +
// 32 j (j < 4), so that no unit's column comes from a division by width / 16 (a column's units by
// consecutive threads; a thread whose unit passes width stores none), and its swizzle is the same
// in each of its columns (c / 4 % 8, c stepped by 32): one pointer stepped by 32 ld, and the
// shared chunks at constant offsets.
__device__ __forceinline__ void StoreAlignedTransposed(const StagedTile& staged, int cols,
                                                       int width, __nv_fp8_storage_t* out,
                                                       int64_t ld) {
  MOE_DEVICE_CHECK(width % 16 == 0 && width <= kFp8TileSize && ld % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0);
  constexpr int kUnits = kFp8TileSize / 16, kColumnStep = kTileThreads / kUnits;
  static_assert(kUnits == kTileWarps, "a column's units are its staged chunks");
  static_assert(kColumnStep % 32 == 0, "a thread's columns share the swizzle");
  const int u = threadIdx.x % kUnits, first = threadIdx.x / kUnits;
  if (16 * u >= width) return;
  const int swizzle = first / 4 % 8;
  __nv_fp8_storage_t* unit = out + first * ld + 16 * u;
#pragma unroll
  for (int j = 0; j < kFp8TileSize / kColumnStep; ++j, unit += kColumnStep * ld) {
    const int c = first + kColumnStep * j;
    if (c < cols) *reinterpret_cast<uint4*>(unit) = staged.chunk[c][u ^ swizzle];
  }
}

}  // namespace moe::cuda
