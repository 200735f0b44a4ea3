// Causal attention forward on tensor cores: the bf16 path where the Hopper kernel does not run
// (attention_sm90.cu; attention.cu has the design note).
//
// One block of 4 warps per (64 queries, batch, head); warp w owns query rows 16 w .. 16 w + 15
// and keeps its Q operand in registers. Key/value tiles of 64 rows stream through a two-stage
// cp.async ring. Per tile: S = Q K^T (mma), online softmax in fp32 with Exp2 on scores
// pre-scaled by log2(e) / sqrt(d), then O += P V with P re-packed to bf16 straight from the
// accumulators. At the end O / l goes out through shared memory in 16-byte stores and
// lse = (m + log2 l) * ln 2, the natural-log value of the contract.
#include "engine/kernels/cuda/attention/attention_internal.cuh"
#include "engine/kernels/cuda/attention/attention_mma.cuh"

namespace moe::cuda::attention {
namespace {

constexpr int kBlockM = 64;  // queries per block
constexpr int kBlockN = 64;  // keys per tile

template <int D>
constexpr size_t ForwardSmemBytes() {
  return (kBlockM + 4 * kBlockN) * SmemStride<D>() * sizeof(bf16);
}

// One key tile of the online softmax, for this thread's rows row_lo and row_lo + 8 (m, l: their
// running max and partial sum; o: their output accumulators): the scores sc of keys k0 .. k0 +
// kBlockN - 1, scaled by scale_log2 (-inf for a key after the row, on a tile that crosses the
// diagonal of the block at q0), become P = 2^(s - m) with m the new running max; l and o are
// rescaled by 2^(m_old - m), and l gains the row's P.
template <int D>
__device__ __forceinline__ void SoftmaxTile(float (&sc)[kBlockN / 8][4], float (&o)[D / 8][4],
                                            float (&m)[2], float (&l)[2], int k0, int q0,
                                            int row_lo, int lane, float scale_log2) {
  const bool diagonal = k0 + kBlockN - 1 > q0;  // some key of the tile is after some row
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + nt * 8 + 2 * (lane % 4) + e % 2;
      const int row = row_lo + (e / 2) * 8;
      float x = sc[nt][e] * scale_log2;
      if (diagonal && key > row) x = -INFINITY;
      sc[nt][e] = x;
      tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
    }
  }
  float correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r]);
    correction[r] = Exp2(m[r] - m_new);
    m[r] = m_new;
    l[r] *= correction[r];
  }
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[nt][e] = Exp2(sc[nt][e] - m[e / 2]);
      l[e / 2] += sc[nt][e];
    }
  }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    o[dt][0] *= correction[0];
    o[dt][1] *= correction[0];
    o[dt][2] *= correction[1];
    o[dt][3] *= correction[1];
  }
}

// The end of a block for this thread's rows row_lo and row_lo + 8: l summed over the quad (the
// row's four threads), inv = 1 / l, and lse[stats + row] = (m + log2 l) ln 2 written by the
// quad's first thread for rows before seq (stats: the first row of the block's (batch, head)).
__device__ __forceinline__ void FinishRows(const float (&m)[2], float (&l)[2], float (&inv)[2],
                                           float* lse, int64_t stats, int row_lo, int lane,
                                           int seq) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.0f / l[r];
    const int row = row_lo + r * 8;
    if (lane % 4 == 0 && row < seq) lse[stats + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// grid (query blocks, batch * heads), the longest rows first.
template <int D>
__global__ void __launch_bounds__(kMmaThreads) MmaForwardKernel(ForwardParams<bf16> p) {
  constexpr int kStride = SmemStride<D>();
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* sq = reinterpret_cast<bf16*>(smem_bytes);  // (64, D)
  bf16* sk = sq + kBlockM * kStride;               // 2 stages of (64, D)
  bf16* sv = sk + 2 * kBlockN * kStride;           // 2 stages of (64, D)

  const Dims& s = p.dims;
  const QueryBlock qb = ThisQueryBlock<D>(s, kBlockM);
  const int q0 = qb.q0, b = qb.b, h = qb.h, q_stride = qb.q_stride, kv_stride = qb.kv_stride;
  const bf16* k = KvHead<D>(p.k, qb, s);
  const bf16* v = KvHead<D>(p.v, qb, s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_lo = q0 + warp * 16 + lane / 4;  // this thread's rows: row_lo and row_lo + 8

  LoadTileAsync<kBlockM, D>(sq, QueryHead<D>(p.q, qb, s), q_stride, q0, s.seq);
  LoadTileAsync<kBlockN, D>(sk, k, kv_stride, 0, s.seq);
  LoadTileAsync<kBlockN, D>(sv, v, kv_stride, 0, s.seq);
  CpAsyncCommit();
  CpAsyncWaitAll();
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) LoadA<D>(sq + warp * 16 * kStride, kk, qa[kk]);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // per-thread partial sums; the quad's sum is taken at the end
  // Key tile 0 holds key 0 <= every row, so m is finite after the first tile: no inf - inf.
  const int num_tiles = (min(q0 + kBlockM, s.seq) + kBlockN - 1) / kBlockN;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % 2;
    if (tile + 1 < num_tiles) {
      LoadTileAsync<kBlockN, D>(sk + (stage ^ 1) * kBlockN * kStride, k, kv_stride,
                                (tile + 1) * kBlockN, s.seq);
      LoadTileAsync<kBlockN, D>(sv + (stage ^ 1) * kBlockN * kStride, v, kv_stride,
                                (tile + 1) * kBlockN, s.seq);
    }
    CpAsyncCommit();

    float sc[kBlockN / 8][4] = {};
    MmaABt<kBlockN, D>(qa, sk + stage * kBlockN * kStride, sc);

    SoftmaxTile<D>(sc, o, m, l, tile * kBlockN, q0, row_lo, lane, s.scale_log2);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[4];
      AccumulatorToA(sc, kk, pa);
      MmaAB<D>(pa, sv + stage * kBlockN * kStride, kk, o);
    }
    CpAsyncWaitAll();
    __syncthreads();  // the next tile has landed; nobody reads this stage any more
  }

  float inv[2];
  FinishRows(m, l, inv, p.lse, (static_cast<int64_t>(b) * s.heads + h) * s.seq, row_lo, lane,
             s.seq);
  // The warp's own rows of sq are free: only this warp read them, into qa.
  StoreRows<D>(o, inv[0], inv[1], sq + warp * 16 * kStride,
               p.out + RowOffset(b, warp * 16 + q0, h, s.seq, s.heads, D), q_stride, q0 + warp * 16,
               s.seq);
}

template <int D>
void Forward(const ForwardParams<bf16>& p, cudaStream_t stream) {
  LaunchInClusters(MmaForwardKernel<D>,
                   dim3((p.dims.seq + kBlockM - 1) / kBlockM, p.dims.batch * p.dims.heads),
                   kMmaThreads, ForwardSmemBytes<D>(), 1, stream, p);
}

}  // namespace

void LaunchAttentionForward(const ForwardParams<bf16>& params, int head_dim, cudaStream_t stream) {
  if (TryAttentionForwardSm90(params, head_dim, stream)) return;
  WithHeadDim(head_dim, [&](auto d) { Forward<d.value>(params, stream); });
}

}  // namespace moe::cuda::attention
