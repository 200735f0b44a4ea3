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

constexpr int kBlockQ = 128;  // query rows per CTA: 64 per consumer warpgroup
constexpr int kStages = 2;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 3 * 128;
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert((kProducerRegisters + 2 * kConsumerRegisters) * 128 <= 65536);
constexpr int kBoxColumns = 64;               // bf16 columns of one 128-byte swizzled row
constexpr int kRowBytes = 128;                // one row of a box
constexpr int kKMajorSliceBytes = 32;         // the next 16 columns of a K-major operand
constexpr int kMNMajorSliceBytes = 16 * 128;  // the next 16 rows of an MN-major operand
constexpr int kCoreGroupBytes = 1024;         // the next 8 rows

// A tile of `kRows` rows of D columns: D / 64 boxes of kRows x 64.
template <int kRows, int D>
constexpr int kTileBytes = D / kBoxColumns* kRows* kRowBytes;

// Shared memory from a 1024-byte-aligned base: kResident query-side tiles of kBlockQ rows (Q, and
// dout for dq), key and value stages of kKvRows rows, then the mbarriers.
template <int D, int kResident, int kKvRows>
struct TileSmem {
  static constexpr int kResidentBytes = kTileBytes<kBlockQ, D>;
  static constexpr int kKvBytes = kTileBytes<kKvRows, D>;
  static constexpr int kDataBytes = kResident * kResidentBytes + 2 * kStages * kKvBytes;
  static constexpr int kBarriers = 1 + 4 * kStages;
  static constexpr size_t kBytes = 1023 + kDataBytes + 8 * kBarriers;

  uint32_t base;

  __device__ uint32_t Resident(int i) const { return base + i * kResidentBytes; }
  __device__ uint32_t K(int stage) const {
    return base + kResident * kResidentBytes + stage * kKvBytes;
  }
  __device__ uint32_t V(int stage) const { return K(kStages + stage); }
  __device__ uint32_t Barrier(int i) const { return base + kDataBytes + 8 * i; }
  __device__ uint32_t ResidentFull() const { return Barrier(0); }
  __device__ uint32_t KFull(int stage) const { return Barrier(1 + stage); }
  __device__ uint32_t KEmpty(int stage) const { return Barrier(1 + kStages + stage); }
  __device__ uint32_t VFull(int stage) const { return Barrier(1 + 2 * kStages + stage); }
  __device__ uint32_t VEmpty(int stage) const { return Barrier(1 + 3 * kStages + stage); }

  __device__ void InitBarriers() const {
    MbarrierInit(ResidentFull(), 1);
    for (int st = 0; st < kStages; ++st) {
      MbarrierInit(KFull(st), 1);
      MbarrierInit(VFull(st), 1);
      MbarrierInit(KEmpty(st), kConsumerWarps);
      MbarrierInit(VEmpty(st), kConsumerWarps);
    }
    FenceBarrierInit();
  }
};

// One CTA's place: query rows [q0, q0 + kBlockQ) of head h of sequence b (kv head kvh), the
// longest rows first over grid (query tiles, batch * heads).
struct QueryTile {
  int q0, b, h, kvh;

  __device__ explicit QueryTile(const Dims& s)
      : q0((gridDim.x - 1 - blockIdx.x) * kBlockQ),
        b(blockIdx.y / s.heads),
        h(blockIdx.y % s.heads),
        kvh(h / (s.heads / s.kv_heads)) {}
};

// The key tiles of kKvRows rows a query tile needs: those with a key at or before its last row,
// walked from the last one down (the first one processed holds the diagonal).
template <int kKvRows>
__device__ __forceinline__ int KeyTiles(const QueryTile& tile, const Dims& s) {
  return (min(tile.q0 + kBlockQ, s.seq) + kKvRows - 1) / kKvRows;
}

// The TMA boxes of the tile of kRows rows at `row0` of (head, sequence) into `dst`; their bytes
// complete_tx on `bar` (the caller has announced them).
template <int kRows, int D>
__device__ __forceinline__ void LoadTile(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                         int head, int row0, int batch) {
#pragma unroll
  for (int box = 0; box < D / kBoxColumns; ++box)
    TmaLoad4d(map, dst + box * kRows * kRowBytes, bar, box * kBoxColumns, head, row0, batch);
}

// The producer thread: the query-side tiles once, then every key tile's K and V through the ring.
template <int D, int kResident, int kKvRows>
__device__ __forceinline__ void Produce(const TileSmem<D, kResident, kKvRows>& smem,
                                        const CUtensorMap* const (&resident)[kResident],
                                        const CUtensorMap& k_map, const CUtensorMap& v_map,
                                        const QueryTile& tile, int num_tiles) {
  MbarrierArriveExpectTx(smem.ResidentFull(), kResident * kTileBytes<kBlockQ, D>);
#pragma unroll
  for (int i = 0; i < kResident; ++i)
    LoadTile<kBlockQ, D>(*resident[i], smem.Resident(i), smem.ResidentFull(), tile.h, tile.q0,
                         tile.b);
  PipelineState<kStages> state;
  for (int it = 0; it < num_tiles; ++it) {
    const int k0 = (num_tiles - 1 - it) * kKvRows;
    MbarrierWait(smem.KEmpty(state.stage), state.phase ^ 1);
    MbarrierArriveExpectTx(smem.KFull(state.stage), kTileBytes<kKvRows, D>);
    LoadTile<kKvRows, D>(k_map, smem.K(state.stage), smem.KFull(state.stage), tile.kvh, k0, tile.b);
    MbarrierWait(smem.VEmpty(state.stage), state.phase ^ 1);
    MbarrierArriveExpectTx(smem.VFull(state.stage), kTileBytes<kKvRows, D>);
    LoadTile<kKvRows, D>(v_map, smem.V(state.stage), smem.VFull(state.stage), tile.kvh, k0, tile.b);
    state.Advance();
  }
}

// Descriptors of 16-column slice kk of a K-major tile (rows at `rows`, boxes of kRows rows), and
// of 16-row slice kk of an MN-major one (its N = the tile's D columns).
template <int kRows>
__device__ __forceinline__ uint64_t KMajor(uint32_t rows, int kk) {
  return SmemDescriptor(rows + kk / 4 * kRows * kRowBytes + kk % 4 * kKMajorSliceBytes, 16,
                        kCoreGroupBytes);
}
template <int kRows>
__device__ __forceinline__ uint64_t MNMajor(uint32_t tile, int kk) {
  return SmemDescriptor(tile + kk * kMNMajorSliceBytes, kRows * kRowBytes, kCoreGroupBytes);
}

// acc (this warpgroup's 64 rows x kKvRows) = A B^T over D: A's rows at `a_rows` in a tile of
// kBlockQ rows, B a key-side tile of kKvRows rows. Issued and committed, not waited for.
template <int D, int kKvRows>
__device__ __forceinline__ void IssueScores(float (&acc)[kKvRows / 2], uint32_t a_rows,
                                            uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    WgmmaSS<0, 0>(acc, KMajor<kBlockQ>(a_rows, kk), KMajor<kKvRows>(b_tile, kk), kk > 0);
}

// acc (64 x D) += P B with P (64 x kKvRows) in accumulator registers, packed to bf16 here, and B
// the key-side tile of kKvRows x D at `b_tile` (MN-major). Issued and committed, not waited for.
template <int D, int kKvRows>
__device__ __forceinline__ void IssueProducts(float (&acc)[D / 2], const float (&p)[kKvRows / 2],
                                              uint32_t b_tile,
                                              uint32_t (&packed)[kKvRows / 16][4]) {
  const auto pack = [](float lo, float hi) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  };
#pragma unroll
  for (int kk = 0; kk < kKvRows / 16; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) packed[kk][q] = pack(p[8 * kk + 2 * q], p[8 * kk + 2 * q + 1]);
  }
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kKvRows / 16; ++kk)
    WgmmaRS<1>(acc, packed[kk], MNMajor<kKvRows>(b_tile, kk), true);
  WgmmaCommitGroup();
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// This consumer thread: its warpgroup's 64 rows start at query q0 + 64 consumer; its own rows
// are Row(0) and Row(1) (accumulator registers 4 i + 2 h + j hold row Row(h), column Column(i, j)).
struct ConsumerThread {
  int consumer, warp, lane;

  __device__ ConsumerThread()
      : consumer(threadIdx.x / 128 - 1), warp(threadIdx.x / 32 % 4), lane(threadIdx.x % 32) {}
  __device__ int LocalRow(int half) const { return warp * 16 + lane / 4 + 8 * half; }
  __device__ int Row(const QueryTile& tile, int half) const {
    return tile.q0 + consumer * 64 + LocalRow(half);
  }
  __device__ static int Column(int i, int j) { return 8 * i + 2 * (threadIdx.x % 4) + j; }
  __device__ uint32_t Rows(uint32_t resident) const { return resident + consumer * 64 * kRowBytes; }
  __device__ void Release(uint32_t empty_bar) const {
    if (lane == 0) MbarrierArrive(empty_bar);
  }
};

// The epilogue: acc (64 x D) times the row's scale as bf16 over the consumer's own rows of the
// resident tile at `rows` (free: only this warpgroup's wgmmas, all complete, read them), laid out
// as the 64-row TMA box of `map`, then stored by TMA (rows past seq are clipped).
template <int D>
__device__ __forceinline__ void StoreRows(const float (&acc)[D / 2], const float (&scale)[2],
                                          uint8_t* smem_raw, uint32_t rows, const CUtensorMap& map,
                                          const ConsumerThread& me, const QueryTile& tile,
                                          int seq) {
  uint8_t* rows_generic = smem_raw + (rows - SmemAddress(smem_raw));
#pragma unroll
  for (int r = 0; r < D / 2; r += 2) {
    const int i = r / 4, half = r / 2 % 2;  // 8-column block, row half
    const int row = me.LocalRow(half);
    const int offset = i / 8 * kBlockQ * kRowBytes + row * kRowBytes + ((i % 8) ^ (row % 8)) * 16 +
                       4 * (me.lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(rows_generic + offset) =
        __floats2bfloat162_rn(acc[r] * scale[half], acc[r + 1] * scale[half]);
  }
  FenceProxyAsync();
  NamedBarrierSync(1 + me.consumer, 128);
  const int row0 = tile.q0 + me.consumer * 64;
  if (threadIdx.x % 128 == 0 && row0 < seq) {
#pragma unroll
    for (int box = 0; box < D / kBoxColumns; ++box)
      TmaStore4d(map, rows + box * kBlockQ * kRowBytes, box * kBoxColumns, tile.h, row0, tile.b);
    BulkCommitGroup();
    BulkWaitAll();
  }
}

// Barrier set-up and the producer's part, common to both kernels; returns true in consumer threads.
template <int D, int kResident, int kKvRows>
__device__ __forceinline__ bool StartRoles(const TileSmem<D, kResident, kKvRows>& smem,
                                           const CUtensorMap* const (&resident)[kResident],
                                           const CUtensorMap& k_map, const CUtensorMap& v_map,
                                           const QueryTile& tile, int num_tiles) {
  if (threadIdx.x == 0) smem.InitBarriers();
  __syncthreads();
  if (threadIdx.x >= 128) {
    IncreaseMaxRegisters<kConsumerRegisters>();
    return true;
  }
  DecreaseMaxRegisters<kProducerRegisters>();
  if (threadIdx.x == 0) {
    PrefetchTensorMap(k_map);
    PrefetchTensorMap(v_map);
    Produce(smem, resident, k_map, v_map, tile, num_tiles);
  }
  return false;
}

constexpr int kForwardKvRows = 128;  // keys per tile of the forward
static_assert(kForwardKvRows == kBlockQ, "the forward's diagonal is its first tile's alone");

// Forward. grid (query tiles, batch * heads).
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90ForwardKernel(const __grid_constant__ CUtensorMap q_map,
                      const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map,
                      const __grid_constant__ CUtensorMap out_map, float* lse, Dims s) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const TileSmem<D, 1, kForwardKvRows> smem{(SmemAddress(smem_raw) + 1023) & ~1023u};
  const QueryTile tile(s);
  const int num_tiles = KeyTiles<kForwardKvRows>(tile, s);
  const CUtensorMap* const resident[1] = {&q_map};
  if (!StartRoles(smem, resident, k_map, v_map, tile, num_tiles)) return;

  const ConsumerThread me;
  const uint32_t q_rows = me.Rows(smem.Resident(0));
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // this thread's partial sums; the quad's sum is taken at the end
  MbarrierWait(smem.ResidentFull(), 0);
  PipelineState<kStages> state;
  for (int it = 0; it < num_tiles; ++it) {
    const int k0 = (num_tiles - 1 - it) * kForwardKvRows;
    float sc[kForwardKvRows / 2];
    MbarrierWait(smem.KFull(state.stage), state.phase);
    WgmmaFence();
    IssueScores<D, kForwardKvRows>(sc, q_rows, smem.K(state.stage));
    WgmmaCommitGroup();
    WgmmaWaitGroup<0>();
    FenceAccumulators(sc);
    me.Release(smem.KEmpty(state.stage));

    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int r = 0; r < kForwardKvRows / 2; ++r) {
      float x = sc[r] * s.scale_log2;
      if (it == 0 && k0 + ConsumerThread::Column(r / 4, r % 2) > me.Row(tile, r / 2 % 2))
        x = -INFINITY;
      sc[r] = x;
      tile_max[r / 2 % 2] = fmaxf(tile_max[r / 2 % 2], x);
    }
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_new = fmaxf(m[half], QuadMax(tile_max[half]));
      correction[half] = exp2f(m[half] - m_new);
      m[half] = m_new;
      l[half] *= correction[half];
    }
#pragma unroll
    for (int r = 0; r < kForwardKvRows / 2; ++r) {
      sc[r] = exp2f(sc[r] - m[r / 2 % 2]);
      l[r / 2 % 2] += sc[r];
    }
#pragma unroll
    for (int r = 0; r < D / 2; ++r) o[r] *= correction[r / 2 % 2];

    MbarrierWait(smem.VFull(state.stage), state.phase);
    uint32_t packed[kForwardKvRows / 16][4];
    IssueProducts<D, kForwardKvRows>(o, sc, smem.V(state.stage), packed);
    WgmmaWaitGroup<0>();
    FenceAccumulators(o);
    me.Release(smem.VEmpty(state.stage));
    state.Advance();
  }

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] = QuadSum(l[half]);
    inv[half] = 1.0f / l[half];
    const int row = me.Row(tile, half);
    if (me.lane % 4 == 0 && row < s.seq) {
      lse[(static_cast<int64_t>(tile.b) * s.heads + tile.h) * s.seq + row] =
          (m[half] + log2f(l[half])) * kLn2;
    }
  }
  StoreRows<D>(o, inv, smem_raw, q_rows, out_map, me, tile, s.seq);
#else
  __trap();
#endif
}

constexpr int kDqKvRows = 64;  // keys per tile of dq: S, dP and dQ fit the registers at D = 128

// dq = scale * sum over key tiles of dS K, dS = P (dout V^T - delta), P = exp2(Q K^T c - lse
// log2 e), zero where key > row. Query-side tiles Q and dout stay resident. grid as the forward's.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90BackwardQKernel(const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap dout_map,
                        const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map,
                        const __grid_constant__ CUtensorMap dq_map, const float* lse,
                        const float* delta, Dims s) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const TileSmem<D, 2, kDqKvRows> smem{(SmemAddress(smem_raw) + 1023) & ~1023u};
  const QueryTile tile(s);
  const int num_tiles = KeyTiles<kDqKvRows>(tile, s);
  const CUtensorMap* const resident[2] = {&q_map, &dout_map};
  if (!StartRoles(smem, resident, k_map, v_map, tile, num_tiles)) return;

  const ConsumerThread me;
  const uint32_t q_rows = me.Rows(smem.Resident(0)), dout_rows = me.Rows(smem.Resident(1));
  const int64_t stats = (static_cast<int64_t>(tile.b) * s.heads + tile.h) * s.seq;
  float lse2[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = me.Row(tile, half);
    lse2[half] = row < s.seq ? lse[stats + row] * kLog2e : 0.0f;
    row_delta[half] = row < s.seq ? delta[stats + row] : 0.0f;
  }
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  MbarrierWait(smem.ResidentFull(), 0);
  PipelineState<kStages> state;
  for (int it = 0; it < num_tiles; ++it) {
    const int k0 = (num_tiles - 1 - it) * kDqKvRows;
    float p[kDqKvRows / 2], ds[kDqKvRows / 2];
    MbarrierWait(smem.KFull(state.stage), state.phase);
    WgmmaFence();
    IssueScores<D, kDqKvRows>(p, q_rows, smem.K(state.stage));
    WgmmaCommitGroup();
    MbarrierWait(smem.VFull(state.stage), state.phase);
    WgmmaFence();
    IssueScores<D, kDqKvRows>(ds, dout_rows, smem.V(state.stage));
    WgmmaCommitGroup();
    WgmmaWaitGroup<0>();
    FenceAccumulators(p);
    FenceAccumulators(ds);
    me.Release(smem.VEmpty(state.stage));

    const bool diagonal = k0 + kDqKvRows - 1 > tile.q0;
#pragma unroll
    for (int r = 0; r < kDqKvRows / 2; ++r) {
      const int half = r / 2 % 2;
      const float prob = exp2f(p[r] * s.scale_log2 - lse2[half]);
      const bool masked =
          diagonal && k0 + ConsumerThread::Column(r / 4, r % 2) > me.Row(tile, half);
      ds[r] = masked ? 0.0f : prob * (ds[r] - row_delta[half]);
    }
    uint32_t packed[kDqKvRows / 16][4];
    IssueProducts<D, kDqKvRows>(dq, ds, smem.K(state.stage), packed);
    WgmmaWaitGroup<0>();
    FenceAccumulators(dq);
    me.Release(smem.KEmpty(state.stage));
    state.Advance();
  }
  const float scale[2] = {s.scale, s.scale};
  StoreRows<D>(dq, scale, smem_raw, q_rows, dq_map, me, tile, s.seq);
#else
  __trap();
#endif
}

// A map of a (batch, seq, heads, D) bf16 tensor in boxes of `rows` sequence rows x 64 columns.
bool HeadMap(CUtensorMap* map, const bf16* base, const Dims& s, int heads, int d, uint32_t rows) {
  const uint64_t ud = d, uh = heads, useq = s.seq, ub = s.batch;
  return EncodeTensorMap<4>(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, {ud, uh, useq, ub},
                            {ud * 2, uh * ud * 2, useq * uh * ud * 2},
                            {kBoxColumns, 1, rows, 1}) == cudaSuccess;
}

// Launches `kernel` over (query tiles, batch * heads) with `smem_bytes` of shared memory.
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), size_t smem_bytes, const Dims& s, cudaStream_t stream,
            const Args&... args) {
  MOE_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem_bytes)));
  const dim3 grid((s.seq + kBlockQ - 1) / kBlockQ, s.batch * s.heads);
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args...);
  MOE_CUDA_CHECK_LAUNCH();
}

template <int D>
bool Forward(const ForwardParams<bf16>& p, cudaStream_t stream) {
  CUtensorMap q_map, k_map, v_map, out_map;
  const Dims& s = p.dims;
  if (!HeadMap(&q_map, p.q, s, s.heads, D, kBlockQ) ||
      !HeadMap(&k_map, p.k, s, s.kv_heads, D, kForwardKvRows) ||
      !HeadMap(&v_map, p.v, s, s.kv_heads, D, kForwardKvRows) ||
      !HeadMap(&out_map, p.out, s, s.heads, D, 64)) {
    return false;
  }
  Launch(Sm90ForwardKernel<D>, TileSmem<D, 1, kForwardKvRows>::kBytes, s, stream, q_map, k_map,
         v_map, out_map, p.lse, s);
  return true;
}

template <int D>
bool BackwardQ(const BackwardParams<bf16>& p, cudaStream_t stream) {
  CUtensorMap q_map, dout_map, k_map, v_map, dq_map;
  const Dims& s = p.dims;
  if (!HeadMap(&q_map, p.q, s, s.heads, D, kBlockQ) ||
      !HeadMap(&dout_map, p.dout, s, s.heads, D, kBlockQ) ||
      !HeadMap(&k_map, p.k, s, s.kv_heads, D, kDqKvRows) ||
      !HeadMap(&v_map, p.v, s, s.kv_heads, D, kDqKvRows) ||
      !HeadMap(&dq_map, p.dq, s, s.heads, D, 64)) {
    return false;
  }
  Launch(Sm90BackwardQKernel<D>, TileSmem<D, 2, kDqKvRows>::kBytes, s, stream, q_map, dout_map,
         k_map, v_map, dq_map, p.lse, p.delta, s);
  return true;
}

std::atomic<bool> sm90_allowed{true};

bool Sm90Runs() {
  int device = 0;
  MOE_CUDA_CALL(cudaGetDevice(&device));
  return sm90_allowed.load() && Sm90aKernelsRunOn(device);
}

}  // namespace

void AllowSm90Attention(bool allowed) { sm90_allowed.store(allowed); }

bool TryAttentionForwardSm90(const ForwardParams<bf16>& params, int head_dim, cudaStream_t stream) {
  if (!Sm90Runs()) return false;
  bool launched = false;
  WithHeadDim(head_dim, [&](auto d) { launched = Forward<d.value>(params, stream); });
  return launched;
}

bool TryAttentionBackwardQSm90(const BackwardParams<bf16>& params, int head_dim,
                               cudaStream_t stream) {
  if (!Sm90Runs()) return false;
  bool launched = false;
  WithHeadDim(head_dim, [&](auto d) { launched = BackwardQ<d.value>(params, stream); });
  return launched;
}

}  // namespace moe::cuda::attention
