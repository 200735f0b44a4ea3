// Causal attention backward on tensor cores: the bf16 path where the Hopper kernels do not run
// (attention_sm90.cu; attention.cu has the design note).
// delta = rowsum(dout * out) is already in memory when these run.
//
// dk/dv kernel: the query heads of a GQA group are split over a thread-block cluster of `split`
// blocks (the largest divisor of the group up to 8): one block per head would otherwise walk the
// whole group's query tiles, and the causal grid's first key block, group x seq / kM tiles, sets
// the kernel's time while most SMs idle. Each block of 4 warps takes (64 keys, batch, kv head,
// group / split query heads); warp w owns keys 16 w .. 16 w + 15 and accumulates their partial dk,
// dv in registers. It walks its query heads and, for each, the query tiles at or after its keys
// (kDkvBlockM rows, two-stage cp.async ring of Q, dout, lse, delta). Per tile, everything is
// computed transposed so keys stay the row (M) dimension: S^T = K Q^T, P^T = exp2(S^T * c - lse *
// log2 e), dP^T = V dout^T, dV += P^T dout, dS^T = P^T (dP^T - delta), dK += dS^T Q; P^T and dS^T
// feed the next mma from registers. At the end every block puts its partial sums in its shared
// memory as f32, and block r of the cluster adds its share of the rows over the cluster's blocks in
// rank order through distributed shared memory, scales dk by 1/sqrt(d) and stores both.
//
// dq kernel: one block per (64 queries, batch, head); warp w owns 16 query rows and keeps their
// Q and dout operands in registers. Per key tile (kDqBlockN rows): S = Q K^T, P = exp2(...),
// dP = dout V^T, dS = P (dP - delta), dQ += dS K.
//
// Every gradient element is accumulated in a fixed order (the cluster's ranks in order):
// deterministic.
#include <cooperative_groups.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/attention/attention_internal.cuh"
#include "engine/kernels/cuda/attention/attention_mma.cuh"

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

// The partial dk and dv of a dk/dv block as f32 rows, padded so a warp's fragment writes do not
// share banks; they reuse the block's shared memory after its loop.
template <int D>
constexpr int kPartialStride = D + 4;
template <int D>
constexpr size_t PartialSmemBytes() {
  return 2 * kDkvBlockN * kPartialStride<D> * sizeof(float);
}
static_assert(PartialSmemBytes<64>() <= DkvSmemBytes<64>());
static_assert(PartialSmemBytes<128>() <= DkvSmemBytes<128>());

template <int D>
constexpr size_t DqSmemBytes() {
  return (2 * kDqBlockM + 4 * kDqBlockN<D>)*SmemStride<D>() * sizeof(bf16);
}

// Writes a warp's (16, D) accumulator fragment to rows of a kPartialStride<D> f32 buffer.
template <int D>
__device__ __forceinline__ void WritePartial(const float (&acc)[D / 8][4], float* rows) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + 2 * t;
    *reinterpret_cast<float2*>(rows + g * kPartialStride<D> + col) =
        make_float2(acc[dt][0], acc[dt][1]);
    *reinterpret_cast<float2*>(rows + (g + 8) * kPartialStride<D> + col) =
        make_float2(acc[dt][2], acc[dt][3]);
  }
}

// The cluster's barrier (with release/acquire of shared memory) and a pointer into the shared
// memory of block `rank` of the cluster. Images older than sm_90 are launched with clusters of
// one block (KvSplit), where these are the block's own.
__device__ __forceinline__ void ClusterSync() {
#if __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}
__device__ __forceinline__ const float* ClusterBlockSmem(float* local, int rank) {
#if __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(local, rank);
#else
  return local;
#endif
}

// One query tile's share of a warp's dk, dv in the dk/dv kernel (its 16 keys from key_lo - lane / 4
// at k_rows and v_rows, (16, D) of the shared K and V; the tile's kM queries from q0 at cq, cdo,
// with their lse and delta at clse, cdelta). Everything is transposed so keys stay the rows: P^T,
// dP^T, then dV += P^T dout and dK += dS^T Q, P^T and dS^T packed straight from the accumulators.
template <int D>
__device__ __forceinline__ void AddTileGradients(const bf16* k_rows, const bf16* v_rows,
                                                 const bf16* cq, const bf16* cdo, const float* clse,
                                                 const float* cdelta, int q0, int k0, int key_lo,
                                                 int lane, const Dims& s, float (&dk)[D / 8][4],
                                                 float (&dv)[D / 8][4]) {
  constexpr int kM = kDkvBlockM<D>;
  // P^T = exp2(K Q^T * c - lse * log2 e), zero where query < key or query >= seq.
  float pt[kM / 8][4] = {};
  MmaABt<kM, D>(k_rows, cq, pt);
  const bool masked = q0 < k0 + kDkvBlockN - 1 || q0 + kM > s.seq;
#pragma unroll
  for (int nt = 0; nt < kM / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = nt * 8 + 2 * (lane % 4) + e % 2;
      const int query = q0 + c;
      const int key = key_lo + (e / 2) * 8;
      const float prob = Exp2(pt[nt][e] * s.scale_log2 - clse[c] * kLog2e);
      pt[nt][e] = masked && (query < key || query >= s.seq) ? 0.0f : prob;
    }
  }
  // dP^T = V dout^T.
  float dpt[kM / 8][4] = {};
  MmaABt<kM, D>(v_rows, cdo, dpt);
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
}

// This block's share of the dk/dv kernel's result, after every block of the cluster has put its
// partial sums in its shared memory (`partial`: dk rows, then dv rows): rows [rank 64 / split,
// (rank + 1) 64 / split) of the 64 keys from k0, each the sum over the cluster's blocks in rank
// order, dk scaled by 1 / sqrt(d), stored as bf16 to p.dk and p.dv (rows before seq).
template <int D>
__device__ __forceinline__ void StoreClusterSums(float* partial, const BackwardParams<bf16>& p,
                                                 int b, int kvh, int k0, int rank, int split) {
  const Dims& s = p.dims;
  const int row_lo = rank * kDkvBlockN / split, row_hi = (rank + 1) * kDkvBlockN / split;
  constexpr int kQuads = D / 4;  // float4 pieces per row
  for (int i = threadIdx.x; i < 2 * (row_hi - row_lo) * kQuads; i += kMmaThreads) {
    const bool is_dv = i >= (row_hi - row_lo) * kQuads;
    const int j = is_dv ? i - (row_hi - row_lo) * kQuads : i;
    const int row = row_lo + j / kQuads, col = j % kQuads * 4;
    if (k0 + row >= s.seq) continue;
    const int offset = ((is_dv ? kDkvBlockN : 0) + row) * kPartialStride<D> + col;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int r = 0; r < split; ++r) {
      const float4 part = *reinterpret_cast<const float4*>(ClusterBlockSmem(partial, r) + offset);
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    const float scale = is_dv ? 1.0f : s.scale;
    bf16* dst = (is_dv ? p.dv : p.dk) + RowOffset(b, k0 + row, kvh, s.seq, s.kv_heads, D) + col;
    reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(sum.x * scale, sum.y * scale);
    reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(sum.z * scale, sum.w * scale);
  }
}

// grid (key blocks, batch * kv_heads * split) in clusters of (1, split, 1).
template <int D>
__global__ void __launch_bounds__(kMmaThreads)
    MmaBackwardKvKernel(BackwardParams<bf16> p, int split) {
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
  const GridPlace at = LongestFirst(split);
  const int k0 = at.rank * kDkvBlockN;
  const int rank = blockIdx.y % split;  // in the cluster
  const int b = at.group / s.kv_heads, kvh = at.group % s.kv_heads;
  const int heads_per_block = s.heads / s.kv_heads / split;
  const int head0 = (kvh * split + rank) * heads_per_block;
  const int q_stride = s.heads * D, kv_stride = s.kv_heads * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_lo = k0 + warp * 16 + lane / 4;  // this thread's keys: key_lo and key_lo + 8

  // Iteration `it` covers query tile `first_tile + it % tiles_per_head` of head
  // head0 + it / tiles_per_head; tiles before first_tile see none of these keys.
  const int first_tile = k0 / kM;
  const int tiles_per_head = (s.seq + kM - 1) / kM - first_tile;
  const int num_iterations = heads_per_block * tiles_per_head;
  auto load_tile = [&](int it, int stage) {
    const int h = head0 + it / tiles_per_head;
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

    AddTileGradients<D>(sk + warp * 16 * kStride, sv + warp * 16 * kStride, cq, cdo, clse, cdelta,
                        q0, k0, key_lo, lane, s, dk, dv);
    CpAsyncWaitAll();
    __syncthreads();  // the next tile has landed; nobody reads this stage any more
  }

  // The loop's last barrier ended every read of the tiles: the memory takes the partial sums.
  float* partial = reinterpret_cast<float*>(smem_bytes);  // dk rows, then dv rows
  WritePartial<D>(dk, partial + warp * 16 * kPartialStride<D>);
  WritePartial<D>(dv, partial + (kDkvBlockN + warp * 16) * kPartialStride<D>);
  ClusterSync();
  StoreClusterSums<D>(partial, p, b, kvh, k0, rank, split);
  ClusterSync();  // no block leaves while another reads its shared memory
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
        const float prob = Exp2(pr[nt][e] * s.scale_log2 - lse2[e / 2]);
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

// Whether `kernel`'s image on the current device is sm_90 or later (has clusters). Asked of the
// driver once per (kernel, device): the backward launches it for every layer.
bool ImageHasClusters(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> known;
  int device = 0;
  MOE_CUDA_CALL(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto [it, first] = known.try_emplace({kernel, device}, false);
  if (first) {
    cudaFuncAttributes attributes;
    MOE_CUDA_CALL(cudaFuncGetAttributes(&attributes, kernel));
    it->second = attributes.binaryVersion >= 90;
  }
  return it->second;
}

// Blocks per (key block, batch, kv head) of the dk/dv kernel: the largest divisor of the GQA group
// that a portable cluster holds; 1 where the kernel's image is older than sm_90 (no clusters).
int KvSplit(int group, const void* kernel) {
  return ImageHasClusters(kernel) ? ClusterSplit(group) : 1;
}

template <int D>
void Backward(const BackwardParams<bf16>& p, cudaStream_t stream) {
  const Dims& s = p.dims;
  const int split =
      KvSplit(s.heads / s.kv_heads, reinterpret_cast<const void*>(MmaBackwardKvKernel<D>));
  LaunchInClusters(MmaBackwardKvKernel<D>,
                   dim3((s.seq + kDkvBlockN - 1) / kDkvBlockN, s.batch * s.kv_heads * split),
                   kMmaThreads, DkvSmemBytes<D>(), split, stream, p, split);

  LaunchInClusters(MmaBackwardQKernel<D>,
                   dim3((s.seq + kDqBlockM - 1) / kDqBlockM, s.batch * s.heads), kMmaThreads,
                   DqSmemBytes<D>(), 1, stream, p);
}

}  // namespace

void LaunchAttentionBackward(const BackwardParams<bf16>& params, int head_dim,
                             cudaStream_t stream) {
  if (TryAttentionBackwardSm90(params, head_dim, stream)) return;
  WithHeadDim(head_dim, [&](auto d) { Backward<d.value>(params, stream); });
}

}  // namespace moe::cuda::attention
