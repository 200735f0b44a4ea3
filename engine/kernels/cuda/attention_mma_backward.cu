// Causal attention backward on tensor cores: the bf16 path (attention.cu has the design note).
// delta = rowsum(dout * out) is already in memory when these run.
//
// dk/dv kernel: one block of 4 warps per (64 keys, batch, kv head); warp w owns keys
// 16 w .. 16 w + 15 and accumulates their dk, dv in registers. It walks the query heads of the
// group and, for each, the query tiles at or after its keys (kDkvBlockM rows, two-stage cp.async
// ring of Q, dout, lse, delta). Per tile, everything is computed transposed so keys stay the
// row (M) dimension: S^T = K Q^T, P^T = exp2(S^T * c - lse * log2 e), dP^T = V dout^T,
// dV += P^T dout, dS^T = P^T (dP^T - delta), dK += dS^T Q; P^T and dS^T feed the next mma from
// registers. dk is scaled by 1/sqrt(d) once at the end.
//
// dq kernel: one block per (64 queries, batch, head); warp w owns 16 query rows and keeps their
// Q and dout operands in registers. Per key tile (kDqBlockN rows): S = Q K^T, P = exp2(...),
// dP = dout V^T, dS = P (dP - delta), dQ += dS K.
//
// Every gradient element is accumulated by one thread in a fixed order: deterministic.
#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/attention_internal.cuh"
#include "engine/kernels/cuda/attention_mma.cuh"

namespace moe::cuda::attention {
namespace {

constexpr int kDkvBlockN = 64;  // keys per dk/dv block
constexpr int kDqBlockM = 64;   // queries per dq block
// The streamed tile is smaller at d = 128 to keep the fp32 tiles in registers.
template <int D>
constexpr int kDkvBlockM = D == 128 ? 32 : 64;  // queries per tile of the dk/dv loop
template <int D>
constexpr int kDqBlockN = D == 128 ? 32 : 64;  // keys per tile of the dq loop

template <int D>
constexpr size_t DkvSmemBytes() {
  return (2 * kDkvBlockN + 4 * kDkvBlockM<D>)*SmemStride<D>() * sizeof(bf16) +
         4 * kDkvBlockM<D> * sizeof(float);
}

template <int D>
constexpr size_t DqSmemBytes() {
  return (2 * kDqBlockM + 4 * kDqBlockN<D>)*SmemStride<D>() * sizeof(bf16);
}

// grid (key blocks, batch * kv_heads).
template <int D>
__global__ void __launch_bounds__(kMmaThreads) MmaBackwardKvKernel(BackwardParams<bf16> p) {
  constexpr int kStride = SmemStride<D>();
  constexpr int kM = kDkvBlockM<D>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* sk = reinterpret_cast<bf16*>(smem_bytes);                  // (64, D)
  bf16* sv = sk + kDkvBlockN * kStride;                            // (64, D)
  bf16* sq = sv + kDkvBlockN * kStride;                            // 2 stages of (kM, D)
  bf16* sdo = sq + 2 * kM * kStride;                               // 2 stages of (kM, D)
  float* slse = reinterpret_cast<float*>(sdo + 2 * kM * kStride);  // 2 stages of (kM)
  float* sdelta = slse + 2 * kM;                                   // 2 stages of (kM)

  const Dims& s = p.dims;
  const int k0 = blockIdx.x * kDkvBlockN;
  const int b = blockIdx.y / s.kv_heads, kvh = blockIdx.y % s.kv_heads;
  const int group = s.heads / s.kv_heads;
  const int q_stride = s.heads * D, kv_stride = s.kv_heads * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_lo = k0 + warp * 16 + lane / 4;  // this thread's keys: key_lo and key_lo + 8

  // Iteration `it` covers query tile `first_tile + it % tiles_per_head` of head
  // kvh * group + it / tiles_per_head; tiles before first_tile see none of these keys.
  const int first_tile = k0 / kM;
  const int tiles_per_head = (s.seq + kM - 1) / kM - first_tile;
  const int num_iterations = group * tiles_per_head;
  auto load_tile = [&](int it, int stage) {
    const int h = kvh * group + it / tiles_per_head;
    const int q0 = (first_tile + it % tiles_per_head) * kM;
    const int64_t stat_offset = (static_cast<int64_t>(b) * s.heads + h) * s.seq;
    LoadTileAsync<kM, D>(sq + stage * kM * kStride, p.q + RowOffset(b, 0, h, s.seq, s.heads, D),
                         q_stride, q0, s.seq);
    LoadTileAsync<kM, D>(sdo + stage * kM * kStride, p.dout + RowOffset(b, 0, h, s.seq, s.heads, D),
                         q_stride, q0, s.seq);
    LoadStatAsync<kM>(slse + stage * kM, p.lse + stat_offset, q0, s.seq);
    LoadStatAsync<kM>(sdelta + stage * kM, p.delta + stat_offset, q0, s.seq);
  };

  LoadTileAsync<kDkvBlockN, D>(sk, p.k + RowOffset(b, 0, kvh, s.seq, s.kv_heads, D), kv_stride, k0,
                               s.seq);
  LoadTileAsync<kDkvBlockN, D>(sv, p.v + RowOffset(b, 0, kvh, s.seq, s.kv_heads, D), kv_stride, k0,
                               s.seq);
  load_tile(0, 0);
  CpAsyncCommit();
  CpAsyncWaitAll();
  __syncthreads();

  float dk[D / 8][4] = {};
  float dv[D / 8][4] = {};
  for (int it = 0; it < num_iterations; ++it) {
    const int stage = it % 2;
    if (it + 1 < num_iterations) load_tile(it + 1, stage ^ 1);
    CpAsyncCommit();
    const bf16* cq = sq + stage * kM * kStride;
    const bf16* cdo = sdo + stage * kM * kStride;
    const float* clse = slse + stage * kM;
    const float* cdelta = sdelta + stage * kM;
    const int q0 = (first_tile + it % tiles_per_head) * kM;

    // P^T = exp2(K Q^T * c - lse * log2 e), zero where query < key or query >= seq.
    float pt[kM / 8][4] = {};
    MmaABt<kM, D>(sk + warp * 16 * kStride, cq, pt);
    const bool masked = q0 < k0 + kDkvBlockN - 1 || q0 + kM > s.seq;
#pragma unroll
    for (int nt = 0; nt < kM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * (lane % 4) + e % 2;
        const int query = q0 + c;
        const int key = key_lo + (e / 2) * 8;
        const float prob = exp2f(pt[nt][e] * s.scale_log2 - clse[c] * kLog2e);
        pt[nt][e] = masked && (query < key || query >= s.seq) ? 0.0f : prob;
      }
    }
    // dP^T = V dout^T.
    float dpt[kM / 8][4] = {};
    MmaABt<kM, D>(sv + warp * 16 * kStride, cdo, dpt);
    // dV += P^T dout.
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) {
      uint32_t a[4];
      AccumulatorToA(pt, kk, a);
      MmaAB<D>(a, cdo, kk, dv);
    }
    // dS^T = P^T (dP^T - delta), in place of dP^T; dK += dS^T Q.
#pragma unroll
    for (int nt = 0; nt < kM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * (lane % 4) + e % 2;
        dpt[nt][e] = pt[nt][e] * (dpt[nt][e] - cdelta[c]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) {
      uint32_t a[4];
      AccumulatorToA(dpt, kk, a);
      MmaAB<D>(a, cq, kk, dk);
    }
    CpAsyncWaitAll();
    __syncthreads();  // the next tile has landed; nobody reads this stage any more
  }

  // The warp's own rows of sk and sv are free: only this warp read them.
  const int row0 = k0 + warp * 16;
  StoreRows<D>(dk, s.scale, s.scale, sk + warp * 16 * kStride,
               p.dk + RowOffset(b, row0, kvh, s.seq, s.kv_heads, D), kv_stride, row0, s.seq);
  StoreRows<D>(dv, 1.0f, 1.0f, sv + warp * 16 * kStride,
               p.dv + RowOffset(b, row0, kvh, s.seq, s.kv_heads, D), kv_stride, row0, s.seq);
}

// grid (query blocks, batch * heads), the longest rows first.
template <int D>
__global__ void __launch_bounds__(kMmaThreads) MmaBackwardQKernel(BackwardParams<bf16> p) {
  constexpr int kStride = SmemStride<D>();
  constexpr int kN = kDqBlockN<D>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* sq = reinterpret_cast<bf16*>(smem_bytes);  // (64, D)
  bf16* sdo = sq + kDqBlockM * kStride;            // (64, D)
  bf16* sk = sdo + kDqBlockM * kStride;            // 2 stages of (kN, D)
  bf16* sv = sk + 2 * kN * kStride;                // 2 stages of (kN, D)

  const Dims& s = p.dims;
  const QueryBlock qb = ThisQueryBlock<D>(s, kDqBlockM);
  const int q0 = qb.q0, b = qb.b, h = qb.h, q_stride = qb.q_stride, kv_stride = qb.kv_stride;
  const bf16* k = KvHead<D>(p.k, qb, s);
  const bf16* v = KvHead<D>(p.v, qb, s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_lo = q0 + warp * 16 + lane / 4;  // this thread's rows: row_lo and row_lo + 8

  LoadTileAsync<kDqBlockM, D>(sq, QueryHead<D>(p.q, qb, s), q_stride, q0, s.seq);
  LoadTileAsync<kDqBlockM, D>(sdo, QueryHead<D>(p.dout, qb, s), q_stride, q0, s.seq);
  LoadTileAsync<kN, D>(sk, k, kv_stride, 0, s.seq);
  LoadTileAsync<kN, D>(sv, v, kv_stride, 0, s.seq);
  CpAsyncCommit();
  const int64_t stat_offset = (static_cast<int64_t>(b) * s.heads + h) * s.seq;
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + r * 8;
    lse2[r] = row < s.seq ? p.lse[stat_offset + row] * kLog2e : 0.0f;
    delta[r] = row < s.seq ? p.delta[stat_offset + row] : 0.0f;
  }
  CpAsyncWaitAll();
  __syncthreads();
  uint32_t qa[D / 16][4], doa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    LoadA<D>(sq + warp * 16 * kStride, kk, qa[kk]);
    LoadA<D>(sdo + warp * 16 * kStride, kk, doa[kk]);
  }

  float dq[D / 8][4] = {};
  const int num_tiles = (min(q0 + kDqBlockM, s.seq) + kN - 1) / kN;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % 2;
    if (tile + 1 < num_tiles) {
      LoadTileAsync<kN, D>(sk + (stage ^ 1) * kN * kStride, k, kv_stride, (tile + 1) * kN, s.seq);
      LoadTileAsync<kN, D>(sv + (stage ^ 1) * kN * kStride, v, kv_stride, (tile + 1) * kN, s.seq);
    }
    CpAsyncCommit();
    const bf16* ck = sk + stage * kN * kStride;
    const bf16* cv = sv + stage * kN * kStride;

    // P = exp2(Q K^T * c - lse * log2 e), zero where key > row.
    float pr[kN / 8][4] = {};
    MmaABt<kN, D>(qa, ck, pr);
    const int k0 = tile * kN;
    const bool diagonal = k0 + kN - 1 > q0;
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * (lane % 4) + e % 2;
        const float prob = exp2f(pr[nt][e] * s.scale_log2 - lse2[e / 2]);
        pr[nt][e] = diagonal && key > row_lo + (e / 2) * 8 ? 0.0f : prob;
      }
    }
    // dS = P (dout V^T - delta), in place of dP; dQ += dS K.
    float ds[kN / 8][4] = {};
    MmaABt<kN, D>(doa, cv, ds);
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = pr[nt][e] * (ds[nt][e] - delta[e / 2]);
    }
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t a[4];
      AccumulatorToA(ds, kk, a);
      MmaAB<D>(a, ck, kk, dq);
    }
    CpAsyncWaitAll();
    __syncthreads();  // the next tile has landed; nobody reads this stage any more
  }

  // The warp's own rows of sq are free: only this warp read them, into qa.
  StoreRows<D>(dq, s.scale, s.scale, sq + warp * 16 * kStride,
               p.dq + RowOffset(b, q0 + warp * 16, h, s.seq, s.heads, D), q_stride, q0 + warp * 16,
               s.seq);
}

template <int D>
void Backward(const BackwardParams<bf16>& p, cudaStream_t stream) {
  const Dims& s = p.dims;
  constexpr size_t kDkvSmem = DkvSmemBytes<D>();
  MOE_CUDA_CALL(cudaFuncSetAttribute(MmaBackwardKvKernel<D>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kDkvSmem)));
  const dim3 kv_grid((s.seq + kDkvBlockN - 1) / kDkvBlockN, s.batch * s.kv_heads);
  MmaBackwardKvKernel<D><<<kv_grid, kMmaThreads, kDkvSmem, stream>>>(p);
  MOE_CUDA_CHECK_LAUNCH();

  constexpr size_t kDqSmem = DqSmemBytes<D>();
  MOE_CUDA_CALL(cudaFuncSetAttribute(MmaBackwardQKernel<D>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kDqSmem)));
  const dim3 q_grid((s.seq + kDqBlockM - 1) / kDqBlockM, s.batch * s.heads);
  MmaBackwardQKernel<D><<<q_grid, kMmaThreads, kDqSmem, stream>>>(p);
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void LaunchAttentionBackward(const BackwardParams<bf16>& params, int head_dim,
                             cudaStream_t stream) {
  WithHeadDim(head_dim, [&](auto d) { Backward<d.value>(params, stream); });
}

}  // namespace moe::cuda::attention
