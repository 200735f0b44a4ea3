// Causal attention forward on Hopper (sm_90a): wgmma on TMA-loaded, 128-byte-swizzled tiles,
// warp-specialised. The bf16 forward takes it on compute capability 9.0 (attention_sm90.h);
// elsewhere the mma.sync kernel of attention_mma_forward.cu runs. attention.cu has the design
// note of the whole op; the math is the same online softmax.
//
// One CTA of 3 warpgroups per (128 queries, batch, head), the longest rows first:
//   - warpgroup 0 produces: one thread TMA-loads the query tile once, then streams the key and
//     value tiles (128 rows each) through a 2-stage ring with their own full/empty mbarriers, so
//     S = Q K^T starts before V has landed. Key tiles go from the diagonal one down to tile 0.
//   - warpgroups 1 and 2 consume 64 query rows each. Per key tile: S = Q K^T (D / 16 m64n128k16
//     wgmmas, both operands K-major in shared memory); scores scaled by log2(e) / sqrt(d), masked
//     on the diagonal tile; the running max m and sum l in fp32 registers; O rescaled, then
//     O += P V with P packed to bf16 straight from the S accumulators (wgmma's A from registers)
//     and V read MN-major (8 m64nDk16 wgmmas).
//   - Epilogue: each consumer writes O / l as bf16 over its own rows of the query tile, laid out
//     as TMA's swizzled boxes, and TMA-stores them (rows past seq are clipped); lse =
//     (m + log2 l) ln 2 per row, natural log as the contract says.
// The diagonal tile comes first and holds every row's own key, so m is finite after it (no
// inf - inf). Rows and keys past seq are TMA's zero fill: keys past seq are later than every real
// row, so the causal mask removes them; rows past seq are never stored. Each output element is
// computed in one fixed order: deterministic.
//
// Layouts (sm90_ptx.cuh; the rules in grouped_gemm_sm90.cuh's file comment): a tile of 128 rows
// of (batch, seq, heads, D) is D / 64 TMA boxes of 128 rows x 64 columns (16 KiB each, row r at
// byte 128 r, its 16-byte chunk c at c ^ (r % 8)). As a K-major operand (Q for S; K as S's B),
// the k-th 16 columns of a box start 32 k bytes in, 8-row groups 1024 bytes apart. As an
// MN-major operand (V as B of P V: keys are its K, D its N) the k-th 16 keys start 2048 k bytes
// in, and the 64-wide column blocks are the boxes, 16 KiB apart.
#include "engine/kernels/cuda/attention_sm90.h"

#include <atomic>

#include "engine/core/cuda_check.h"

#include "engine/kernels/cuda/attention_internal.cuh"
#include "engine/kernels/cuda/sm90_device.h"
#include "engine/kernels/cuda/sm90_ptx.cuh"

namespace moe::cuda::attention {
namespace {

using namespace moe::cuda::sm90;

constexpr int kBlockQ = 128;   // query rows per CTA: 64 per consumer warpgroup
constexpr int kBlockKv = 128;  // key rows per tile
constexpr int kStages = 2;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 3 * 128;
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert((kProducerRegisters + 2 * kConsumerRegisters) * 128 <= 65536);
constexpr int kBoxColumns = 64;               // bf16 columns of one 128-byte swizzled row
constexpr int kBoxBytes = kBlockKv * 128;     // one 128-row box
constexpr int kConsumerRowBytes = 64 * 128;   // a consumer's 64 rows within a box
constexpr int kKMajorSliceBytes = 32;         // the next 16 columns of a K-major operand
constexpr int kMNMajorSliceBytes = 16 * 128;  // the next 16 rows of an MN-major operand
constexpr int kCoreGroupBytes = 1024;         // the next 8 rows
static_assert(kBlockQ == kBlockKv, "the diagonal is the first tile's alone");

template <int D>
constexpr int kTileBytes = D / kBoxColumns* kBoxBytes;  // Q, one K or one V stage

// Shared memory from a 1024-byte-aligned base: Q, K stages, V stages, then the mbarriers.
template <int D>
struct ForwardSmem {
  uint32_t base;

  __device__ uint32_t Q() const { return base; }
  __device__ uint32_t K(int stage) const { return base + (1 + stage) * kTileBytes<D>; }
  __device__ uint32_t V(int stage) const { return base + (1 + kStages + stage) * kTileBytes<D>; }
  __device__ uint32_t Barrier(int i) const {
    return base + (1 + 2 * kStages) * kTileBytes<D> + 8 * i;
  }
  __device__ uint32_t QFull() const { return Barrier(0); }
  __device__ uint32_t KFull(int stage) const { return Barrier(1 + stage); }
  __device__ uint32_t KEmpty(int stage) const { return Barrier(1 + kStages + stage); }
  __device__ uint32_t VFull(int stage) const { return Barrier(1 + 2 * kStages + stage); }
  __device__ uint32_t VEmpty(int stage) const { return Barrier(1 + 3 * kStages + stage); }
  static constexpr int kBarriers = 1 + 4 * kStages;
  static constexpr size_t kBytes = 1023 + (1 + 2 * kStages) * kTileBytes<D> + 8 * kBarriers;
};

// The TMA boxes of the 128-row tile at `row0` of (head, sequence) from `map` into `dst`.
template <int D>
__device__ __forceinline__ void LoadTile(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                         int head, int row0, int batch) {
  MbarrierArriveExpectTx(bar, kTileBytes<D>);
#pragma unroll
  for (int box = 0; box < D / kBoxColumns; ++box)
    TmaLoad4d(map, dst + box * kBoxBytes, bar, box * kBoxColumns, head, row0, batch);
}

// Columns [16 kk, 16 kk + 16) of this warp's rows of a 64 x 128 accumulator tile, as bf16 A.
__device__ __forceinline__ void PackA(const float (&s)[64], int kk, uint32_t (&a)[4]) {
  const auto pack = [](float lo, float hi) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  };
  a[0] = pack(s[8 * kk + 0], s[8 * kk + 1]);
  a[1] = pack(s[8 * kk + 2], s[8 * kk + 3]);
  a[2] = pack(s[8 * kk + 4], s[8 * kk + 5]);
  a[3] = pack(s[8 * kk + 6], s[8 * kk + 7]);
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// grid (query tiles, batch * heads), the longest rows first.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90ForwardKernel(const __grid_constant__ CUtensorMap q_map,
                      const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map,
                      const __grid_constant__ CUtensorMap out_map, float* lse, Dims s) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const ForwardSmem<D> smem{(SmemAddress(smem_raw) + 1023) & ~1023u};
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBlockQ;
  const int b = blockIdx.y / s.heads, h = blockIdx.y % s.heads;
  const int kvh = h / (s.heads / s.kv_heads);
  const int num_tiles = q0 / kBlockKv + 1;  // key tiles 0 .. the diagonal one
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    MbarrierInit(smem.QFull(), 1);
    for (int st = 0; st < kStages; ++st) {
      MbarrierInit(smem.KFull(st), 1);
      MbarrierInit(smem.VFull(st), 1);
      MbarrierInit(smem.KEmpty(st), kConsumerWarps);
      MbarrierInit(smem.VEmpty(st), kConsumerWarps);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    PrefetchTensorMap(k_map);
    PrefetchTensorMap(v_map);
    LoadTile<D>(q_map, smem.Q(), smem.QFull(), h, q0, b);
    PipelineState<kStages> state;
    for (int it = 0; it < num_tiles; ++it) {
      const int k0 = (num_tiles - 1 - it) * kBlockKv;
      MbarrierWait(smem.KEmpty(state.stage), state.phase ^ 1);
      LoadTile<D>(k_map, smem.K(state.stage), smem.KFull(state.stage), kvh, k0, b);
      MbarrierWait(smem.VEmpty(state.stage), state.phase ^ 1);
      LoadTile<D>(v_map, smem.V(state.stage), smem.VFull(state.stage), kvh, k0, b);
      state.Advance();
    }
    return;
  }

  IncreaseMaxRegisters<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const bool warp_leader = lane == 0;
  // This thread's rows: row_lo and row_lo + 8 (accumulator registers 4 i + 2 h + j, h = 0, 1).
  const int row_lo = q0 + consumer * 64 + warp * 16 + lane / 4;
  const uint32_t q_rows = smem.Q() + consumer * kConsumerRowBytes;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // this thread's partial sums; the quad's sum is taken at the end
  MbarrierWait(smem.QFull(), 0);
  PipelineState<kStages> state;
  for (int it = 0; it < num_tiles; ++it) {
    const int k0 = (num_tiles - 1 - it) * kBlockKv;
    float sc[64];
    MbarrierWait(smem.KFull(state.stage), state.phase);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t column = kk / 4 * kBoxBytes + kk % 4 * kKMajorSliceBytes;
      WgmmaSS<0, 0>(sc, SmemDescriptor(q_rows + column, 16, kCoreGroupBytes),
                    SmemDescriptor(smem.K(state.stage) + column, 16, kCoreGroupBytes), kk > 0);
    }
    WgmmaCommitGroup();
    WgmmaWaitGroup<0>();
    FenceAccumulators(sc);
    if (warp_leader) MbarrierArrive(smem.KEmpty(state.stage));

    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int r = 0; r < 64; ++r) {
      const int row = row_lo + (r / 2 % 2) * 8;
      const int key = k0 + r / 4 * 8 + 2 * (lane % 4) + r % 2;
      float x = sc[r] * s.scale_log2;
      if (it == 0 && key > row) x = -INFINITY;
      sc[r] = x;
      tile_max[r / 2 % 2] = fmaxf(tile_max[r / 2 % 2], x);
    }
    float correction[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float m_new = fmaxf(m[hh], QuadMax(tile_max[hh]));
      correction[hh] = exp2f(m[hh] - m_new);
      m[hh] = m_new;
      l[hh] *= correction[hh];
    }
#pragma unroll
    for (int r = 0; r < 64; ++r) {
      sc[r] = exp2f(sc[r] - m[r / 2 % 2]);
      l[r / 2 % 2] += sc[r];
    }
#pragma unroll
    for (int r = 0; r < D / 2; ++r) o[r] *= correction[r / 2 % 2];
    uint32_t pa[kBlockKv / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockKv / 16; ++kk) PackA(sc, kk, pa[kk]);

    MbarrierWait(smem.VFull(state.stage), state.phase);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockKv / 16; ++kk) {
      WgmmaRS<1>(
          o, pa[kk],
          SmemDescriptor(smem.V(state.stage) + kk * kMNMajorSliceBytes, kBoxBytes, kCoreGroupBytes),
          true);
    }
    WgmmaCommitGroup();
    WgmmaWaitGroup<0>();
    FenceAccumulators(o);
    if (warp_leader) MbarrierArrive(smem.VEmpty(state.stage));
    state.Advance();
  }

  // Epilogue. This warpgroup's rows of the query tile are free: only its own wgmmas read them.
  float inv[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] = QuadSum(l[hh]);
    inv[hh] = 1.0f / l[hh];
    const int row = row_lo + hh * 8;
    if (lane % 4 == 0 && row < s.seq)
      lse[(static_cast<int64_t>(b) * s.heads + h) * s.seq + row] = (m[hh] + log2f(l[hh])) * kLn2;
  }
  uint8_t* q_rows_generic = smem_raw + (q_rows - SmemAddress(smem_raw));
#pragma unroll
  for (int r = 0; r < D / 2; r += 2) {
    const int i = r / 4, hh = r / 2 % 2;            // column block of 8, row half
    const int row = warp * 16 + lane / 4 + 8 * hh;  // within the consumer's 64
    const int offset = i / 8 * kBoxBytes + row * 128 + ((i % 8) ^ (row % 8)) * 16 + 4 * (lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(q_rows_generic + offset) =
        __floats2bfloat162_rn(o[r] * inv[hh], o[r + 1] * inv[hh]);
  }
  FenceProxyAsync();
  NamedBarrierSync(1 + consumer, 128);
  if (threadIdx.x % 128 == 0 && q0 + consumer * 64 < s.seq) {
#pragma unroll
    for (int box = 0; box < D / kBoxColumns; ++box)
      TmaStore4d(out_map, q_rows + box * kBoxBytes, box * kBoxColumns, h, q0 + consumer * 64, b);
    BulkCommitGroup();
    BulkWaitAll();
  }
#else
  __trap();
#endif
}

std::atomic<bool> sm90_allowed{true};

// A map of a (batch, seq, heads, D) bf16 tensor in boxes of `rows` sequence rows x 64 columns.
cudaError_t HeadMap(CUtensorMap* map, const bf16* base, const Dims& s, int heads, int d,
                    uint32_t rows) {
  const uint64_t ud = d, uh = heads, useq = s.seq, ub = s.batch;
  return EncodeTensorMap<4>(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, {ud, uh, useq, ub},
                            {ud * 2, uh * ud * 2, useq * uh * ud * 2}, {kBoxColumns, 1, rows, 1});
}

template <int D>
bool Forward(const ForwardParams<bf16>& p, cudaStream_t stream) {
  CUtensorMap q_map, k_map, v_map, out_map;
  const Dims& s = p.dims;
  if (HeadMap(&q_map, p.q, s, s.heads, D, kBlockQ) != cudaSuccess ||
      HeadMap(&k_map, p.k, s, s.kv_heads, D, kBlockKv) != cudaSuccess ||
      HeadMap(&v_map, p.v, s, s.kv_heads, D, kBlockKv) != cudaSuccess ||
      HeadMap(&out_map, p.out, s, s.heads, D, 64) != cudaSuccess) {
    return false;
  }
  constexpr int kSmem = static_cast<int>(ForwardSmem<D>::kBytes);
  MOE_CUDA_CALL(cudaFuncSetAttribute(Sm90ForwardKernel<D>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((s.seq + kBlockQ - 1) / kBlockQ, s.batch * s.heads);
  Sm90ForwardKernel<D><<<grid, kThreads, kSmem, stream>>>(q_map, k_map, v_map, out_map, p.lse, s);
  MOE_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

void AllowSm90Attention(bool allowed) { sm90_allowed.store(allowed); }

bool TryAttentionForwardSm90(const ForwardParams<bf16>& params, int head_dim, cudaStream_t stream) {
  int device = 0;
  MOE_CUDA_CALL(cudaGetDevice(&device));
  if (!sm90_allowed.load() || !Sm90aKernelsRunOn(device)) return false;
  bool launched = false;
  WithHeadDim(head_dim, [&](auto d) { launched = Forward<d.value>(params, stream); });
  return launched;
}

}  // namespace moe::cuda::attention
