// Causal attention on CUDA cores in exact fp32: the f32 path (attention.cu has the design note).
//
// 256 threads as a 16 x 16 grid (ty = tid / 16, tx = tid % 16) over 64-row tiles. A thread owns
// tile rows ty + 16 i (i < 4) and, for a (64, 64) score tile, columns tx + 16 j (j < 4); for a
// (64, D) output tile, columns tx + 16 j (j < D / 16). The 16 threads of a row share one half
// warp, so row reductions are half-warp shuffles. Tiles sit in shared memory as fp32 with an odd
// row stride (D + 1, 65), so the column walks of the dot products are free of bank conflicts.
//   forward: one block per (64 queries, batch, head); online softmax over 64-key tiles.
//   backward dk/dv: one block per (64 keys, batch, kv head); loops over the group's query heads
//     and the query tiles at or after the key tile. dq: one block per (64 queries, batch, head).
// Each output element is accumulated by one thread in a fixed order: deterministic.
#include <cmath>

#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/attention/attention_internal.cuh"

namespace moe::cuda::attention {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // rows of every tile: queries or keys
constexpr int kScoreStride = kTile + 1;

template <int D>
constexpr int TileFloats() {
  return kTile * (D + 1);
}

// Rows [row0, row0 + 64) of one head into a (64, D + 1) fp32 tile; rows >= seq read as 0.
// `head` points at (b, 0, h, 0); consecutive sequence rows are `row_stride` elements apart.
template <typename T, int D>
__device__ void LoadTile(float* tile, const T* head, int row_stride, int row0, int seq) {
  for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    const int row = row0 + r;
    tile[r * (D + 1) + c] =
        row < seq ? ToFloat(head[static_cast<int64_t>(row) * row_stride + c]) : 0.0f;
  }
}

// acc[i][j] = a[ty + 16 i, :] . b[tx + 16 j, :] over D; a and b are (64, D + 1) tiles.
template <int D>
__device__ void TileDot(const float* a, const float* b, float (&acc)[4][4]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = a[(ty + 16 * i) * (D + 1) + d];
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = b[(tx + 16 * j) * (D + 1) + d];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

// acc[i][j] += sum_r p[ty + 16 i, r] * m[r, tx + 16 j]; p is a (64, 65) score tile, m a
// (64, D + 1) tile.
template <int D>
__device__ void TileMatmulAccumulate(const float* p, const float* m, float (&acc)[4][D / 16]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll 4
  for (int r = 0; r < kTile; ++r) {
    float pv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) pv[i] = p[(ty + 16 * i) * kScoreStride + r];
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      const float mv = m[r * (D + 1) + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i][j] = fmaf(pv[i], mv, acc[i][j]);
    }
  }
}

__device__ __forceinline__ float HalfWarpMax(float x) {
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float HalfWarpSum(float x) {
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// grid (query tiles, batch * heads), the longest rows first.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) FmaForwardKernel(ForwardParams<T> p) {
  extern __shared__ float smem[];
  float* sq = smem;                  // (64, D + 1) queries
  float* sk = sq + TileFloats<D>();  // (64, D + 1) keys
  float* sv = sk + TileFloats<D>();  // (64, D + 1) values
  float* sp = sv + TileFloats<D>();  // (64, 65) probabilities
  const Dims& s = p.dims;
  const QueryBlock qb = ThisQueryBlock<D>(s, kTile);
  const int q0 = qb.q0, b = qb.b, h = qb.h, q_stride = qb.q_stride, kv_stride = qb.kv_stride;
  const T* k = KvHead<D>(p.k, qb, s);
  const T* v = KvHead<D>(p.v, qb, s);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;

  LoadTile<T, D>(sq, QueryHead<D>(p.q, qb, s), q_stride, q0, s.seq);
  float m[4], l[4], o[4][D / 16];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < D / 16; ++j) o[i][j] = 0.0f;
  }
  // Key tile 0 holds key 0 <= every row, so m is finite after the first tile: no inf - inf.
  const int key_end = min(q0 + kTile, s.seq);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the previous tile's readers are done
    LoadTile<T, D>(sk, k, kv_stride, k0, s.seq);
    LoadTile<T, D>(sv, v, kv_stride, k0, s.seq);
    __syncthreads();
    float sc[4][4];
    TileDot<D>(sq, sk, sc);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = q0 + ty + 16 * i;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = k0 + tx + 16 * j;
        sc[i][j] = key <= row ? sc[i][j] * s.scale_log2 : -INFINITY;
        tile_max = fmaxf(tile_max, sc[i][j]);
      }
      const float m_new = fmaxf(m[i], HalfWarpMax(tile_max));
      const float correction = exp2f(m[i] - m_new);
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float prob = exp2f(sc[i][j] - m_new);
        sp[(ty + 16 * i) * kScoreStride + tx + 16 * j] = prob;
        sum += prob;
      }
      l[i] = l[i] * correction + sum;  // per-thread partial; summed over the half warp at the end
#pragma unroll
      for (int j = 0; j < D / 16; ++j) o[i][j] *= correction;
    }
    __syncthreads();
    TileMatmulAccumulate<D>(sp, sv, o);
  }

  T* out = p.out + RowOffset(b, 0, h, s.seq, s.heads, D);
  float* lse = p.lse + (static_cast<int64_t>(b) * s.heads + h) * s.seq;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float total = HalfWarpSum(l[i]);
    const int row = q0 + ty + 16 * i;
    if (row >= s.seq) continue;
    const float inv = 1.0f / total;
#pragma unroll
    for (int j = 0; j < D / 16; ++j)
      out[static_cast<int64_t>(row) * q_stride + tx + 16 * j] = FromFloat<T>(o[i][j] * inv);
    if (tx == 0) lse[row] = (m[i] + log2f(total)) * kLn2;
  }
}

// dk, dv for 64 keys of one kv head. grid (key tiles, batch * kv_heads).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) FmaBackwardKvKernel(BackwardParams<T> p) {
  extern __shared__ float smem[];
  float* sk = smem;                          // (64, D + 1) keys of this block
  float* sv = sk + TileFloats<D>();          // (64, D + 1) values of this block
  float* sq = sv + TileFloats<D>();          // (64, D + 1) queries of the current tile
  float* sdo = sq + TileFloats<D>();         // (64, D + 1) dout of the current tile
  float* sp = sdo + TileFloats<D>();         // (64 keys, 65) P^T
  float* sds = sp + kTile * kScoreStride;    // (64 keys, 65) dS^T
  float* slse = sds + kTile * kScoreStride;  // (64) lse * log2(e) of the tile's queries
  float* sdelta = slse + kTile;              // (64)
  const Dims& s = p.dims;
  const GridPlace at = LongestFirst(1);
  const int k0 = at.rank * kTile;
  const int b = at.group / s.kv_heads, kvh = at.group % s.kv_heads;
  const int group = s.heads / s.kv_heads;
  const int q_stride = s.heads * D, kv_stride = s.kv_heads * D;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;

  LoadTile<T, D>(sk, p.k + RowOffset(b, 0, kvh, s.seq, s.kv_heads, D), kv_stride, k0, s.seq);
  LoadTile<T, D>(sv, p.v + RowOffset(b, 0, kvh, s.seq, s.kv_heads, D), kv_stride, k0, s.seq);
  float dk[4][D / 16], dv[4][D / 16];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < D / 16; ++j) dk[i][j] = dv[i][j] = 0.0f;

  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const T* q = p.q + RowOffset(b, 0, h, s.seq, s.heads, D);
    const T* dout = p.dout + RowOffset(b, 0, h, s.seq, s.heads, D);
    const int64_t stat_offset = (static_cast<int64_t>(b) * s.heads + h) * s.seq;
    // Query tiles before k0 see none of these keys.
    for (int q0 = k0; q0 < s.seq; q0 += kTile) {
      __syncthreads();  // the previous tile's readers are done
      LoadTile<T, D>(sq, q, q_stride, q0, s.seq);
      LoadTile<T, D>(sdo, dout, q_stride, q0, s.seq);
      if (threadIdx.x < kTile) {
        const int row = q0 + threadIdx.x;
        slse[threadIdx.x] = row < s.seq ? p.lse[stat_offset + row] * kLog2e : 0.0f;
        sdelta[threadIdx.x] = row < s.seq ? p.delta[stat_offset + row] : 0.0f;
      }
      __syncthreads();
      float st[4][4], dpt[4][4];
      TileDot<D>(sk, sq, st);    // S^T: rows keys, columns queries
      TileDot<D>(sv, sdo, dpt);  // dP^T
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = tx + 16 * j;
          const int query = q0 + c;
          const float prob =
              (query >= key && query < s.seq) ? exp2f(st[i][j] * s.scale_log2 - slse[c]) : 0.0f;
          sp[(ty + 16 * i) * kScoreStride + c] = prob;
          sds[(ty + 16 * i) * kScoreStride + c] = prob * (dpt[i][j] - sdelta[c]);
        }
      }
      __syncthreads();
      TileMatmulAccumulate<D>(sp, sdo, dv);
      TileMatmulAccumulate<D>(sds, sq, dk);
    }
  }

  T* dk_out = p.dk + RowOffset(b, 0, kvh, s.seq, s.kv_heads, D);
  T* dv_out = p.dv + RowOffset(b, 0, kvh, s.seq, s.kv_heads, D);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = k0 + ty + 16 * i;
    if (key >= s.seq) continue;
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      const int64_t at = static_cast<int64_t>(key) * kv_stride + tx + 16 * j;
      dk_out[at] = FromFloat<T>(dk[i][j] * s.scale);
      dv_out[at] = FromFloat<T>(dv[i][j]);
    }
  }
}

// dq for 64 queries of one head. grid (query tiles, batch * heads), the longest rows first.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) FmaBackwardQKernel(BackwardParams<T> p) {
  extern __shared__ float smem[];
  float* sq = smem;                   // (64, D + 1) queries of this block
  float* sdo = sq + TileFloats<D>();  // (64, D + 1) dout of this block
  float* sk = sdo + TileFloats<D>();  // (64, D + 1) keys of the current tile
  float* sv = sk + TileFloats<D>();   // (64, D + 1) values of the current tile
  float* sds = sv + TileFloats<D>();  // (64, 65) dS
  const Dims& s = p.dims;
  const QueryBlock qb = ThisQueryBlock<D>(s, kTile);
  const int q0 = qb.q0, b = qb.b, h = qb.h, q_stride = qb.q_stride, kv_stride = qb.kv_stride;
  const T* k = KvHead<D>(p.k, qb, s);
  const T* v = KvHead<D>(p.v, qb, s);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;

  LoadTile<T, D>(sq, QueryHead<D>(p.q, qb, s), q_stride, q0, s.seq);
  LoadTile<T, D>(sdo, QueryHead<D>(p.dout, qb, s), q_stride, q0, s.seq);
  const int64_t stat_offset = (static_cast<int64_t>(b) * s.heads + h) * s.seq;
  float lse2[4], delta[4], dq[4][D / 16];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = q0 + ty + 16 * i;
    lse2[i] = row < s.seq ? p.lse[stat_offset + row] * kLog2e : 0.0f;
    delta[i] = row < s.seq ? p.delta[stat_offset + row] : 0.0f;
#pragma unroll
    for (int j = 0; j < D / 16; ++j) dq[i][j] = 0.0f;
  }
  const int key_end = min(q0 + kTile, s.seq);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the previous tile's readers are done
    LoadTile<T, D>(sk, k, kv_stride, k0, s.seq);
    LoadTile<T, D>(sv, v, kv_stride, k0, s.seq);
    __syncthreads();
    float sc[4][4], dp[4][4];
    TileDot<D>(sq, sk, sc);
    TileDot<D>(sdo, sv, dp);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = q0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = k0 + tx + 16 * j;
        const float prob = key <= row ? exp2f(sc[i][j] * s.scale_log2 - lse2[i]) : 0.0f;
        sds[(ty + 16 * i) * kScoreStride + tx + 16 * j] = prob * (dp[i][j] - delta[i]);
      }
    }
    __syncthreads();
    TileMatmulAccumulate<D>(sds, sk, dq);
  }

  T* dq_out = p.dq + RowOffset(b, 0, h, s.seq, s.heads, D);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = q0 + ty + 16 * i;
    if (row >= s.seq) continue;
#pragma unroll
    for (int j = 0; j < D / 16; ++j)
      dq_out[static_cast<int64_t>(row) * q_stride + tx + 16 * j] = FromFloat<T>(dq[i][j] * s.scale);
  }
}

template <typename Kernel, typename Params>
void Launch(Kernel kernel, dim3 grid, size_t smem_bytes, const Params& params,
            cudaStream_t stream) {
  MOE_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem_bytes)));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(params);
  MOE_CUDA_CHECK_LAUNCH();
}

int NumTiles(int seq) { return (seq + kTile - 1) / kTile; }

template <int D>
void Forward(const ForwardParams<float>& p, cudaStream_t stream) {
  const size_t smem = (3 * TileFloats<D>() + kTile * kScoreStride) * sizeof(float);
  Launch(FmaForwardKernel<float, D>, dim3(NumTiles(p.dims.seq), p.dims.batch * p.dims.heads), smem,
         p, stream);
}

template <int D>
void Backward(const BackwardParams<float>& p, cudaStream_t stream) {
  const Dims& s = p.dims;
  const size_t kv_smem =
      (4 * TileFloats<D>() + 2 * kTile * kScoreStride + 2 * kTile) * sizeof(float);
  Launch(FmaBackwardKvKernel<float, D>, dim3(NumTiles(s.seq), s.batch * s.kv_heads), kv_smem, p,
         stream);
  const size_t q_smem = (4 * TileFloats<D>() + kTile * kScoreStride) * sizeof(float);
  Launch(FmaBackwardQKernel<float, D>, dim3(NumTiles(s.seq), s.batch * s.heads), q_smem, p, stream);
}

}  // namespace

void LaunchAttentionForward(const ForwardParams<float>& params, int head_dim, cudaStream_t stream) {
  WithHeadDim(head_dim, [&](auto d) { Forward<d.value>(params, stream); });
}

void LaunchAttentionBackward(const BackwardParams<float>& params, int head_dim,
                             cudaStream_t stream) {
  WithHeadDim(head_dim, [&](auto d) { Backward<d.value>(params, stream); });
}

}  // namespace moe::cuda::attention
