// Building blocks of the bf16 tensor-core attention kernels: cp.async tile loads, ldmatrix,
// mma.sync m16n8k16 (bf16 in, fp32 accumulate), and warp-level products over shared tiles.
//
// Shared tiles are (rows, D) bf16, row-major with a stride of D + 8 elements: the 16 bytes of
// padding put the 8 rows an ldmatrix phase reads into 8 different bank groups.
//
// Fragment layout (PTX ISA, mma.m16n8k16): lane = 4 g + t. An fp32 accumulator tile (16, 8)
// holds c[0..1] at row g, columns 2t, 2t + 1 and c[2..3] at row g + 8. Two adjacent accumulator
// tiles, packed to bf16, are exactly the A operand (16, 16) of the next product, so P and dS
// go from one mma to the next without touching shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "engine/kernels/cuda/common/cuda_common.cuh"

namespace moe::cuda::attention {

constexpr int kMmaThreads = 128;  // 4 warps; each owns 16 rows of the block's tile

template <int D>
constexpr int SmemStride() {
  return D + 8;
}

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; reads nothing and writes zeros when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}

// 4-byte global -> shared copy; writes zero when !valid.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddress(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Rows [row0, row0 + kRows) of one head into a (kRows, D) shared tile; rows >= seq are zeros.
// `head` points at (b, 0, h, 0); consecutive sequence rows are `row_stride` elements apart.
template <int kRows, int D>
__device__ __forceinline__ void LoadTileAsync(bf16* tile, const bf16* head, int row_stride,
                                              int row0, int seq) {
  constexpr int kChunksPerRow = D / 8;
  static_assert(kRows * kChunksPerRow % kMmaThreads == 0);
#pragma unroll
  for (int i = 0; i < kRows * kChunksPerRow / kMmaThreads; ++i) {
    const int idx = threadIdx.x + i * kMmaThreads;
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow * 8;
    const bool valid = row0 + r < seq;
    const bf16* src = valid ? head + static_cast<int64_t>(row0 + r) * row_stride + c : head;
    CpAsync16(tile + r * SmemStride<D>() + c, src, valid);
  }
}

// kRows floats of a (batch, heads, seq) statistic from row0 into shared memory; 0 past seq.
template <int kRows>
__device__ __forceinline__ void LoadStatAsync(float* dst, const float* row_stats, int row0,
                                              int seq) {
  static_assert(kRows <= kMmaThreads);
  if (threadIdx.x < kRows) {
    const bool valid = row0 + threadIdx.x < seq;
    CpAsync4(dst + threadIdx.x, valid ? row_stats + row0 + threadIdx.x : row_stats, valid);
  }
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}

// c (16, 8) += a (16, 16) . b (16, 8).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// The A operand for columns [16 kk, 16 kk + 16) of a warp's (16, N) accumulator tiles.
template <int kTiles>
__device__ __forceinline__ void AccumulatorToA(const float (&c)[kTiles][4], int kk,
                                               uint32_t (&a)[4]) {
  a[0] = PackBf16(c[2 * kk][0], c[2 * kk][1]);
  a[1] = PackBf16(c[2 * kk][2], c[2 * kk][3]);
  a[2] = PackBf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = PackBf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// The A operand for rows [0, 16), columns [16 kk, 16 kk + 16) of a row-major shared tile.
template <int D>
__device__ __forceinline__ void LoadA(const bf16* rows, int kk, uint32_t (&a)[4]) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4(a, rows + (lane % 16) * SmemStride<D>() + kk * 16 + (lane / 16) * 8);
}

// acc (16, N) += A (16, D) . B^T for B an (N, D) shared tile: a score-like product (Q K^T).
// `a` holds the A operand for each 16 columns of D.
template <int N, int D>
__device__ __forceinline__ void MmaABt(const uint32_t (&a)[D / 16][4], const bf16* b,
                                       float (&acc)[N / 8][4]) {
  const int lane = threadIdx.x % 32;
  const bf16* base = b + ((lane % 8) + (lane / 16) * 8) * SmemStride<D>() + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t frag[4];  // b0, b1 of columns [16 np, +8), then of [16 np + 8, +8)
      LdMatrixX4(frag, base + np * 16 * SmemStride<D>() + kk * 16);
      Mma(acc[2 * np], a[kk], frag[0], frag[1]);
      Mma(acc[2 * np + 1], a[kk], frag[2], frag[3]);
    }
  }
}

// The same with A read from the warp's 16 rows of a shared (rows, D) tile, 16 columns at a time
// (fewer live registers than holding all of A).
template <int N, int D>
__device__ __forceinline__ void MmaABt(const bf16* a_rows, const bf16* b, float (&acc)[N / 8][4]) {
  const int lane = threadIdx.x % 32;
  const bf16* base = b + ((lane % 8) + (lane / 16) * 8) * SmemStride<D>() + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    LoadA<D>(a_rows, kk, a);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t frag[4];
      LdMatrixX4(frag, base + np * 16 * SmemStride<D>() + kk * 16);
      Mma(acc[2 * np], a, frag[0], frag[1]);
      Mma(acc[2 * np + 1], a, frag[2], frag[3]);
    }
  }
}

// acc (16, D) += A (16, 16) . B for B rows [16 kk, 16 kk + 16) of a (K, D) shared tile:
// one 16-deep step of a probability-times-values product (P V).
template <int D>
__device__ __forceinline__ void MmaAB(const uint32_t (&a)[4], const bf16* b, int kk,
                                      float (&acc)[D / 8][4]) {
  const int lane = threadIdx.x % 32;
  const bf16* base =
      b + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SmemStride<D>() + (lane / 16) * 8;
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    uint32_t frag[4];  // b0, b1 of columns [16 dp, +8), then of [16 dp + 8, +8)
    LdMatrixX4Trans(frag, base + dp * 16);
    Mma(acc[2 * dp], a, frag[0], frag[1]);
    Mma(acc[2 * dp + 1], a, frag[2], frag[3]);
  }
}

// Writes a warp's (16, D) fp32 accumulator, times `scale`, as bf16 rows of a shared tile, then
// copies those rows to global memory (rows >= seq skipped) in 16-byte pieces.
// `rows` is the warp's own 16 rows of shared memory; `dst` points at global row `row0`.
template <int D>
__device__ __forceinline__ void StoreRows(const float (&acc)[D / 8][4], float scale_lo,
                                          float scale_hi, bf16* rows, bf16* dst, int row_stride,
                                          int row0, int seq) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + 2 * t;
    *reinterpret_cast<__nv_bfloat162*>(rows + g * SmemStride<D>() + col) =
        __floats2bfloat162_rn(acc[dt][0] * scale_lo, acc[dt][1] * scale_lo);
    *reinterpret_cast<__nv_bfloat162*>(rows + (g + 8) * SmemStride<D>() + col) =
        __floats2bfloat162_rn(acc[dt][2] * scale_hi, acc[dt][3] * scale_hi);
  }
  __syncwarp();
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int i = 0; i < 16 * kChunksPerRow / 32; ++i) {
    const int idx = lane + i * 32;
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow * 8;
    if (row0 + r < seq)
      *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * row_stride + c) =
          *reinterpret_cast<const uint4*>(rows + r * SmemStride<D>() + c);
  }
}

}  // namespace moe::cuda::attention
