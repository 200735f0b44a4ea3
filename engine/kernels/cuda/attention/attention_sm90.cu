// Causal attention on Hopper (sm_90a): wgmma on TMA-loaded, 128-byte-swizzled tiles,
// warp-specialised. On compute capability 9.0 the bf16 forward, and the backward at head dim 128,
// run here (attention_sm90.h); elsewhere the mma.sync kernels of attention_mma_*.cu do.
// attention.cu has the design note of the whole op; the math is the same.
//
// Every kernel: one CTA of 3 warpgroups over 128 resident rows, the longest work first.
// Warpgroup 0 produces: one thread TMA-loads the resident tiles once, then streams pairs of tiles
// through a 2-stage ring, each tile with its own full/empty mbarriers (so a consumer starts on the
// first of a pair before the second lands). Warpgroups 1 and 2 consume 64 resident rows each.
//   - Forward, per (128 queries, batch, head): Q resident, (K, V) tiles of 128 keys streamed from
//     the diagonal one down to 0. Per tile: S = Q K^T (D / 16 m64n128k16 wgmmas, both operands
//     K-major in shared memory), masked on the diagonal tile; the running max m of the scores
//     scaled by c = log2(e) / sqrt(d) and the sum l in fp32 registers, P = 2^(S c - m) (one FFMA
//     and one ex2 a score); O rescaled, then O += P V with P packed to bf16 straight from the S
//     accumulators (wgmma's A from registers) and V read MN-major.
//     Epilogue: each consumer writes O / l as bf16 over its own rows of the query tile, laid out
//     as TMA's swizzled boxes, and TMA-stores them (rows past seq are clipped); lse =
//     (m + log2 l) ln 2 per row, natural log as the contract says. The diagonal tile comes first
//     and holds every row's own key, so m is finite after it (no inf - inf).
//   - dq, per (128 queries, batch, head): Q and dout resident, (K, V) tiles of 64 keys streamed;
//     S and dP from shared memory, dQ += dS K from registers; stored like the forward's output.
//   - dk/dv, per (128 keys, batch, kv head, share of the GQA group's heads): K and V resident,
//     (Q, dout) tiles of 64 queries streamed, keys the wgmma rows throughout; each query tile's
//     lse and delta are loaded two per lane and reach the threads through the warp's own shared
//     memory; the partial sums of a thread-block cluster are added in rank order through
//     distributed shared memory.
// Rows and keys past seq are TMA's zero fill and are masked or never stored. No atomics: each
// output element is computed in one fixed order, so results are identical run to run.
//
// Layouts (sm90_ptx.cuh; the rules in grouped_gemm/grouped_gemm_sm90.cuh's file comment): a tile of
// R rows of (batch, seq, heads, D) is D / 64 TMA boxes of R rows x 64 columns (row r at byte 128 r,
// its 16-byte chunk c at c ^ (r % 8)). As a K-major operand (S's A and B) the k-th 16 columns of a
// box start 32 k bytes in, 8-row groups 1024 bytes apart. As an MN-major operand (the B of the
// products with P or dS: the streamed tile's rows are its K, D its N) the k-th 16 rows start
// 2048 k bytes in, and the 64-wide column blocks are the boxes, R x 128 bytes apart.
#include "engine/kernels/cuda/attention/attention_sm90.h"

#include <cooperative_groups.h>

#include <atomic>

#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/attention/attention_internal.cuh"
#include "engine/kernels/cuda/common/sm90_device.h"
#include "engine/kernels/cuda/common/sm90_ptx.cuh"

namespace moe::cuda::attention {
namespace {

using namespace moe::cuda::sm90;

constexpr int kBlockRows = 128;  // resident rows per CTA (queries; keys for dk/dv): 64 a consumer
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
constexpr int TileBytes() {
  return D / kBoxColumns * kRows * kRowBytes;
}

// Shared memory from a 1024-byte-aligned base: kResident tiles of kBlockRows rows (Q; Q and
// dout for dq; K and V for dk/dv), then the ring of stages, each a pair of streamed tiles of
// kStreamRows rows (K and V; Q and dout for dk/dv), then kWarpFloats floats per consumer warp,
// then the mbarriers.
template <int D, int kResident, int kStreamRows, int kWarpFloats = 0>
struct TileSmem {
  static constexpr int kResidentBytes = TileBytes<kBlockRows, D>();
  static constexpr int kStreamBytes = TileBytes<kStreamRows, D>();
  static constexpr int kDataBytes = kResident * kResidentBytes + 2 * kStages * kStreamBytes;
  static constexpr int kWarpBytes = kConsumerWarps * kWarpFloats * 4;
  static constexpr int kBarriers = 1 + 4 * kStages;
  static constexpr int kBarrierBytes = 128;
  static_assert(8 * kBarriers <= kBarrierBytes);
  static constexpr size_t kBytes = 1023 + kDataBytes + kWarpBytes + kBarrierBytes;

  uint8_t* raw;   // the kernel's dynamic shared memory (kBytes)
  uint32_t base;  // the shared address of its first 1024-byte-aligned byte: the layout's start

  __device__ explicit TileSmem(uint8_t* dynamic_smem)
      : raw(dynamic_smem), base((SmemAddress(dynamic_smem) + 1023) & ~1023u) {}
  // A generic pointer to shared `address` (one of the addresses below).
  template <typename T>
  __device__ T* Generic(uint32_t address) const {
    return reinterpret_cast<T*>(raw + (address - SmemAddress(raw)));
  }

  __device__ uint32_t Resident(int i) const { return base + i * kResidentBytes; }
  // Streamed tile `which` (0 or 1) of a stage, its full and empty barriers.
  __device__ uint32_t Streamed(int which, int stage) const {
    return base + kResident * kResidentBytes + (which * kStages + stage) * kStreamBytes;
  }
  // Consumer warp `warp`'s (0 .. kConsumerWarps - 1) floats.
  __device__ float* WarpFloats(int warp) const {
    return Generic<float>(base + kDataBytes) + warp * kWarpFloats;
  }
  __device__ uint32_t Barrier(int i) const { return base + kDataBytes + kWarpBytes + 8 * i; }
  __device__ uint32_t ResidentFull() const { return Barrier(0); }
  __device__ uint32_t Full(int which, int stage) const {
    return Barrier(1 + which * kStages + stage);
  }
  __device__ uint32_t Empty(int which, int stage) const {
    return Barrier(1 + (2 + which) * kStages + stage);
  }

  __device__ void InitBarriers() const {
    MbarrierInit(ResidentFull(), 1);
    for (int which = 0; which < 2; ++which) {
      for (int st = 0; st < kStages; ++st) {
        MbarrierInit(Full(which, st), 1);
        MbarrierInit(Empty(which, st), kConsumerWarps);
      }
    }
    FenceBarrierInit();
  }
};

// The key tiles of kKvRows rows a query block needs (those with a key at or before its last row),
// walked from the last one down: the first one processed holds the diagonal.
template <int kKvRows>
struct KeyTileWalk {
  int tiles;

  __device__ KeyTileWalk(const QueryBlock& tile, const Dims& s)
      : tiles((min(tile.q0 + kBlockRows, s.seq) + kKvRows - 1) / kKvRows) {}
  // The first key of the tile processed `it`-th.
  __device__ int Key0(int it) const { return (tiles - 1 - it) * kKvRows; }
};

// A tile's place in a (batch, seq, heads, D) tensor: rows [row0, row0 + its rows) of `head`.
struct TileAt {
  int head, row0;
};

// The streamed query tiles of a dk/dv CTA, in order: rows [first_row, end_row) of its first head
// in tiles of kRows, then the same rows of each next head. Stepped by one add (no division).
template <int kRows>
struct QueryTileWalk {
  TileAt at;
  int first_row, end_row;

  // The current tile; the walk moves on to the next.
  __device__ TileAt Next() {
    const TileAt current = at;
    at.row0 += kRows;
    if (at.row0 == end_row) {
      at.row0 = first_row;
      ++at.head;
    }
    return current;
  }
};

// body(std::true_type()) where `masked`, else body(std::false_type()): a tile loop compiled twice,
// its mask only in the copy for the tiles that need it.
template <typename Body>
__device__ __forceinline__ void WithMask(bool masked, Body&& body) {
  if (masked) {
    body(std::true_type());
  } else {
    body(std::false_type());
  }
}

// The TMA boxes of the tile of kRows rows at `at` of sequence `batch` into `dst`; their bytes
// complete_tx on `bar` (the caller has announced them).
template <int kRows, int D>
__device__ __forceinline__ void LoadTile(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                         TileAt at, int batch) {
#pragma unroll
  for (int box = 0; box < D / kBoxColumns; ++box)
    TmaLoad4d(map, dst + box * kRows * kRowBytes, bar, box * kBoxColumns, at.head, at.row0, batch);
}

// Barrier set-up and the register split between the producer warpgroup (returns false) and the
// two consumer warpgroups (returns true).
template <typename Smem>
__device__ __forceinline__ bool IsConsumer(const Smem& smem) {
  if (threadIdx.x == 0) smem.InitBarriers();
  __syncthreads();
  if (threadIdx.x >= 128) {
    IncreaseMaxRegisters<kConsumerRegisters>();
    return true;
  }
  DecreaseMaxRegisters<kProducerRegisters>();
  return false;
}

// The producer (thread 0): the resident tiles at `resident_at` once, then for it = 0 .. tiles - 1
// the pair of tiles at streamed_at(it) (called once per it, in order) through the ring (`streamed`
// maps: the first and second tile of a stage). Each stage's two tiles have their own barriers, so
// consumers can start on the first before the second lands.
template <int D, int kResident, int kStreamRows, int kWarpFloats, typename StreamedAt>
__device__ __forceinline__ void Produce(
    const TileSmem<D, kResident, kStreamRows, kWarpFloats>& smem,
    const CUtensorMap* const (&resident)[kResident], TileAt resident_at,
    const CUtensorMap* const (&streamed)[2], int batch, int tiles, StreamedAt streamed_at) {
  MbarrierArriveExpectTx(smem.ResidentFull(), kResident * TileBytes<kBlockRows, D>());
#pragma unroll
  for (int i = 0; i < kResident; ++i)
    LoadTile<kBlockRows, D>(*resident[i], smem.Resident(i), smem.ResidentFull(), resident_at,
                            batch);
  PipelineState<kStages> state;
  for (int it = 0; it < tiles; ++it) {
    const TileAt at = streamed_at(it);
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      MbarrierWait(smem.Empty(which, state.stage), state.phase ^ 1);
      MbarrierArriveExpectTx(smem.Full(which, state.stage), TileBytes<kStreamRows, D>());
      LoadTile<kStreamRows, D>(*streamed[which], smem.Streamed(which, state.stage),
                               smem.Full(which, state.stage), at, batch);
    }
    state.Advance();
  }
}

// The producer of the forward and dq: the query-side `resident` tiles of `tile`, then its key
// tiles' K and V in `keys`' order.
template <int kKvRows, typename Smem, int kResident>
__device__ __forceinline__ void ProduceKeyTiles(const Smem& smem,
                                                const CUtensorMap* const (&resident)[kResident],
                                                const CUtensorMap& k_map, const CUtensorMap& v_map,
                                                const QueryBlock& tile,
                                                const KeyTileWalk<kKvRows>& keys) {
  const CUtensorMap* const streamed[2] = {&k_map, &v_map};
  Produce(smem, resident, {tile.h, tile.q0}, streamed, tile.b, keys.tiles, [&](int it) {
    return TileAt{tile.kvh, keys.Key0(it)};
  });
}

// Descriptors of a K-major tile (rows at `rows`) and of an MN-major one of kRows rows (its N =
// the tile's D columns), and the bytes from their start to 16-column slice kk of a K-major tile of
// kRows-row boxes and to 16-row slice kk of an MN-major one (DescriptorAdvance).
__device__ __forceinline__ uint64_t KMajor(uint32_t rows) {
  return SmemDescriptor(rows, 16, kCoreGroupBytes);
}
template <int kRows>
__device__ __forceinline__ uint64_t MNMajor(uint32_t tile) {
  return SmemDescriptor(tile, kRows * kRowBytes, kCoreGroupBytes);
}
template <int kRows>
constexpr uint32_t KMajorSlice(int kk) {
  return kk / 4 * kRows * kRowBytes + kk % 4 * kKMajorSliceBytes;
}
constexpr uint32_t MNMajorSlice(int kk) { return kk * kMNMajorSliceBytes; }

// acc (this warpgroup's 64 rows x kStreamRows) = A B^T over D: A its rows at `a_rows` of a
// resident tile, B a streamed tile of kStreamRows rows. Issued and committed, not waited for.
template <int D, int kStreamRows>
__device__ __forceinline__ void IssueScores(float (&acc)[kStreamRows / 2], uint32_t a_rows,
                                            uint32_t b_tile) {
  const uint64_t a = KMajor(a_rows), b = KMajor(b_tile);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    WgmmaSS<0, 0>(acc, DescriptorAdvance(a, KMajorSlice<kBlockRows>(kk)),
                  DescriptorAdvance(b, KMajorSlice<kStreamRows>(kk)), kk > 0);
  }
  WgmmaCommitGroup();
}

// acc (64 x D) += P B with P (64 x kStreamRows) in accumulator registers, packed to bf16 here
// into `packed` (live until the wgmmas complete), and B the streamed tile of kStreamRows x D at
// `b_tile` (MN-major). Issued and committed, not waited for.
template <int D, int kStreamRows>
__device__ __forceinline__ void IssueProducts(float (&acc)[D / 2],
                                              const float (&p)[kStreamRows / 2], uint32_t b_tile,
                                              uint32_t (&packed)[kStreamRows / 16][4]) {
  const auto pack = [](float lo, float hi) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  };
#pragma unroll
  for (int kk = 0; kk < kStreamRows / 16; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) packed[kk][q] = pack(p[8 * kk + 2 * q], p[8 * kk + 2 * q + 1]);
  }
  const uint64_t b = MNMajor<kStreamRows>(b_tile);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kStreamRows / 16; ++kk)
    WgmmaRS<1>(acc, packed[kk], DescriptorAdvance(b, MNMajorSlice(kk)), true);
  WgmmaCommitGroup();
}

template <int N>
__device__ __forceinline__ void Zero(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A consumer thread: warpgroup `consumer` owns rows [64 consumer, 64 consumer + 64) of the
// resident tiles; accumulator register 4 i + 2 h + j holds its row LocalRow(h) of those 64 and
// column Column(i, j) of the streamed tile.
struct ConsumerThread {
  int consumer, warp, lane;

  __device__ ConsumerThread()
      : consumer(threadIdx.x / 128 - 1), warp(threadIdx.x / 32 % 4), lane(threadIdx.x % 32) {}
  __device__ int LocalRow(int half) const { return warp * 16 + lane / 4 + 8 * half; }
  // Its warp among the consumers' (0 .. kConsumerWarps - 1).
  __device__ int ConsumerWarp() const { return consumer * 4 + warp; }
  // Its row of the resident tiles that start at row0.
  __device__ int Row(int row0, int half) const { return row0 + consumer * 64 + LocalRow(half); }
  __device__ static int Column(int i, int j) { return 8 * i + 2 * (threadIdx.x % 4) + j; }
  __device__ uint32_t Rows(uint32_t resident) const { return resident + consumer * 64 * kRowBytes; }
  __device__ void Release(uint32_t empty_bar) const {
    if (lane == 0) MbarrierArrive(empty_bar);
  }
};

// The epilogue of the forward and dq: acc (64 x D) times the row's scale as bf16 over the
// consumer's own rows of the resident tile at `rows` (free: only this warpgroup's wgmmas, all
// complete, read them), laid out as the 64-row TMA box of `map`, then stored by TMA (rows past
// seq are clipped).
template <int D, typename Smem>
__device__ __forceinline__ void StoreRows(const float (&acc)[D / 2], const float (&scale)[2],
                                          const Smem& smem, uint32_t rows, const CUtensorMap& map,
                                          const ConsumerThread& me, const QueryBlock& tile,
                                          int seq) {
  uint8_t* rows_generic = smem.template Generic<uint8_t>(rows);
#pragma unroll
  for (int r = 0; r < D / 2; r += 2) {
    const int i = r / 4, half = r / 2 % 2;  // 8-column block, row half
    const int row = me.LocalRow(half);
    const int offset = i / 8 * kBlockRows * kRowBytes + row * kRowBytes +
                       ((i % 8) ^ (row % 8)) * 16 + 4 * (me.lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(rows_generic + offset) =
        __floats2bfloat162_rn(acc[r] * scale[half], acc[r + 1] * scale[half]);
  }
  FenceProxyAsync();
  NamedBarrierSync(1 + me.consumer, 128);
  const int row0 = tile.q0 + me.consumer * 64;
  if (threadIdx.x % 128 == 0 && row0 < seq) {
#pragma unroll
    for (int box = 0; box < D / kBoxColumns; ++box) {
      TmaStore4d(map, rows + box * kBlockRows * kRowBytes, box * kBoxColumns, tile.h, row0, tile.b);
    }
    BulkCommitGroup();
    BulkWaitAll();
  }
}

constexpr int kForwardKvRows = 128;  // keys per tile of the forward
static_assert(kForwardKvRows == kBlockRows, "the forward's diagonal is its first tile's alone");
template <int D>
using ForwardSmem = TileSmem<D, 1, kForwardKvRows>;

// Forward. grid (query tiles, batch * heads).
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90ForwardKernel(const __grid_constant__ CUtensorMap q_map,
                      const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map,
                      const __grid_constant__ CUtensorMap out_map, float* lse, Dims s) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const ForwardSmem<D> smem(smem_raw);
  const QueryBlock tile = ThisQueryBlock<D>(s, kBlockRows);
  const KeyTileWalk<kForwardKvRows> keys(tile, s);
  if (!IsConsumer(smem)) {
    const CUtensorMap* const resident[1] = {&q_map};
    if (threadIdx.x == 0) ProduceKeyTiles(smem, resident, k_map, v_map, tile, keys);
    return;
  }

  const ConsumerThread me;
  const uint32_t q_rows = me.Rows(smem.Resident(0));
  float o[D / 2];
  Zero(o);
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // this thread's partial sums; the quad's sum is taken at the end
  MbarrierWait(smem.ResidentFull(), 0);
  PipelineState<kStages> state;
  for (int it = 0; it < keys.tiles; ++it) {
    const int k0 = keys.Key0(it);
    float sc[kForwardKvRows / 2];
    MbarrierWait(smem.Full(0, state.stage), state.phase);
    IssueScores<D, kForwardKvRows>(sc, q_rows, smem.Streamed(0, state.stage));
    WgmmaWaitGroup<0>();
    FenceAccumulators(sc);
    me.Release(smem.Empty(0, state.stage));

    // Row maxima of the unscaled scores (the scale is positive), the causal mask on the first
    // (diagonal) tile alone (WithMask); m is kept scaled, so that each probability
    // 2^(s c - m) takes one FFMA.
    float tile_max[2] = {-INFINITY, -INFINITY};
    const auto row_maxima = [&](auto diagonal) {
#pragma unroll
      for (int r = 0; r < kForwardKvRows / 2; ++r) {
        if constexpr (decltype(diagonal)::value) {
          if (k0 + ConsumerThread::Column(r / 4, r % 2) > me.Row(tile.q0, r / 2 % 2))
            sc[r] = -INFINITY;
        }
        tile_max[r / 2 % 2] = fmaxf(tile_max[r / 2 % 2], sc[r]);
      }
    };
    WithMask(it == 0, row_maxima);
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_new = fmaxf(m[half], QuadMax(tile_max[half]) * s.scale_log2);
      correction[half] = Exp2(m[half] - m_new);
      m[half] = m_new;
      l[half] *= correction[half];
    }
#pragma unroll
    for (int r = 0; r < kForwardKvRows / 2; ++r) {
      sc[r] = Exp2(fmaf(sc[r], s.scale_log2, -m[r / 2 % 2]));
      l[r / 2 % 2] += sc[r];
    }
#pragma unroll
    for (int r = 0; r < D / 2; ++r) o[r] *= correction[r / 2 % 2];

    MbarrierWait(smem.Full(1, state.stage), state.phase);
    uint32_t packed[kForwardKvRows / 16][4];
    IssueProducts<D, kForwardKvRows>(o, sc, smem.Streamed(1, state.stage), packed);
    WgmmaWaitGroup<0>();
    FenceAccumulators(o);
    me.Release(smem.Empty(1, state.stage));
    state.Advance();
  }

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] = QuadSum(l[half]);
    inv[half] = 1.0f / l[half];
    const int row = me.Row(tile.q0, half);
    if (me.lane % 4 == 0 && row < s.seq) {
      lse[(static_cast<int64_t>(tile.b) * s.heads + tile.h) * s.seq + row] =
          (m[half] + log2f(l[half])) * kLn2;
    }
  }
  StoreRows<D>(o, inv, smem, q_rows, out_map, me, tile, s.seq);
#else
  __trap();
#endif
}

constexpr int kBackwardStreamRows = 64;  // rows per streamed tile of dq and dk/dv (registers)
// Both backward kernels: two resident tiles (Q and dout; K and V), pairs of 64-row tiles streamed;
// dk/dv also keeps per consumer warp the streamed tile's lse log2 e and delta (64 floats each).
template <int D>
using BackwardQSmem = TileSmem<D, 2, kBackwardStreamRows>;
template <int D>
using BackwardKvSmem = TileSmem<D, 2, kBackwardStreamRows, 2 * kBackwardStreamRows>;

// dq = scale * sum over key tiles of dS K, dS = P (dout V^T - delta), P = exp2(Q K^T c - lse
// log2 e), zero where key > row. Q and dout resident, K and V streamed. grid as the forward's.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90BackwardQKernel(const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap dout_map,
                        const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map,
                        const __grid_constant__ CUtensorMap dq_map, const float* lse,
                        const float* delta, Dims s) {
#if MOE_SM90A_KERNELS
  constexpr int kN = kBackwardStreamRows;
  extern __shared__ uint8_t smem_raw[];
  const BackwardQSmem<D> smem(smem_raw);
  const QueryBlock tile = ThisQueryBlock<D>(s, kBlockRows);
  const KeyTileWalk<kN> keys(tile, s);
  if (!IsConsumer(smem)) {
    const CUtensorMap* const resident[2] = {&q_map, &dout_map};
    if (threadIdx.x == 0) ProduceKeyTiles(smem, resident, k_map, v_map, tile, keys);
    return;
  }

  const ConsumerThread me;
  const uint32_t q_rows = me.Rows(smem.Resident(0)), dout_rows = me.Rows(smem.Resident(1));
  const int64_t stats = (static_cast<int64_t>(tile.b) * s.heads + tile.h) * s.seq;
  float lse2[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = me.Row(tile.q0, half);
    lse2[half] = row < s.seq ? lse[stats + row] * kLog2e : 0.0f;
    row_delta[half] = row < s.seq ? delta[stats + row] : 0.0f;
  }
  float dq[D / 2];
  Zero(dq);
  MbarrierWait(smem.ResidentFull(), 0);
  PipelineState<kStages> state;
  for (int it = 0; it < keys.tiles; ++it) {
    const int k0 = keys.Key0(it);
    float p[kN / 2], ds[kN / 2];
    MbarrierWait(smem.Full(0, state.stage), state.phase);
    IssueScores<D, kN>(p, q_rows, smem.Streamed(0, state.stage));
    MbarrierWait(smem.Full(1, state.stage), state.phase);
    IssueScores<D, kN>(ds, dout_rows, smem.Streamed(1, state.stage));
    WgmmaWaitGroup<0>();
    FenceAccumulators(p);
    FenceAccumulators(ds);
    me.Release(smem.Empty(1, state.stage));

    // dS, with the causal mask only on tiles that cross the diagonal (WithMask).
    const auto gradients = [&](auto diagonal) {
#pragma unroll
      for (int r = 0; r < kN / 2; ++r) {
        const int half = r / 2 % 2;
        float grad = Exp2(p[r] * s.scale_log2 - lse2[half]) * (ds[r] - row_delta[half]);
        if constexpr (decltype(diagonal)::value) {
          if (k0 + ConsumerThread::Column(r / 4, r % 2) > me.Row(tile.q0, half)) grad = 0.0f;
        }
        ds[r] = grad;
      }
    };
    WithMask(k0 + kN - 1 > tile.q0, gradients);
    uint32_t packed[kN / 16][4];
    IssueProducts<D, kN>(dq, ds, smem.Streamed(0, state.stage), packed);
    WgmmaWaitGroup<0>();
    FenceAccumulators(dq);
    me.Release(smem.Empty(0, state.stage));
    state.Advance();
  }
  const float scale[2] = {s.scale, s.scale};
  StoreRows<D>(dq, scale, smem, q_rows, dq_map, me, tile, s.seq);
#else
  __trap();
#endif
}

// The dk/dv partial sums of a CTA as f32 in its shared memory (after its loop): dk rows, then dv
// rows, D floats each, the 16-byte chunk c of row r at chunk c ^ (r % 8) (the fragment writes of
// 8 rows then fall in different banks).
template <int D>
__device__ __forceinline__ int PartialOffset(int which, int row, int column) {
  const int chunk = column / 4;
  return ((which * kBlockRows + row) * D + (chunk ^ (row % 8)) * 4 + column % 4);
}

// Lane l's lse and delta of queries l and l + 32 (0 past seq) of a dk/dv CTA's query tile `tile`
// of sequence b (lse and delta: (batch, heads, seq)).
struct QueryStats {
  float lse_lo, lse_hi, delta_lo, delta_hi;
};
__device__ __forceinline__ QueryStats LoadQueryStats(const float* lse, const float* delta,
                                                     const Dims& s, int b, const TileAt& tile,
                                                     int lane) {
  const int64_t stats = (static_cast<int64_t>(b) * s.heads + tile.head) * s.seq;
  const int query_lo = tile.row0 + lane, query_hi = query_lo + 32;
  QueryStats out;
  out.lse_lo = out.lse_hi = out.delta_lo = out.delta_hi = 0.0f;
  if (query_lo < s.seq) {
    out.lse_lo = lse[stats + query_lo];
    out.delta_lo = delta[stats + query_lo];
  }
  if (query_hi < s.seq) {
    out.lse_hi = lse[stats + query_hi];
    out.delta_hi = delta[stats + query_hi];
  }
  return out;
}

// The warp's query stats in its shared floats (kM lse times log2 e, then kM deltas), once every
// lane has read the last tile's.
template <int kM>
__device__ __forceinline__ void ShareQueryStats(float* warp_stats, const QueryStats& stats,
                                                int lane) {
  __syncwarp();  // every lane has read the last tile's values
  warp_stats[lane] = stats.lse_lo * kLog2e;
  warp_stats[lane + 32] = stats.lse_hi * kLog2e;
  warp_stats[kM + lane] = stats.delta_lo;
  warp_stats[kM + lane + 32] = stats.delta_hi;
  __syncwarp();
}

// A thread's column pairs [first, last) of the warp's shared lse (`which` 0) or delta (1).
template <int kM>
__device__ __forceinline__ void ReadQueryStats(const float* warp_stats, int which, int first,
                                               int last, float2 (&pairs)[kM / 8]) {
#pragma unroll
  for (int i = first; i < last; ++i)
    pairs[i] =
        *reinterpret_cast<const float2*>(warp_stats + which * kM + ConsumerThread::Column(i, 0));
}

// P^T of one query tile at `at` in place of the scores pt (keys from k0 the rows): exp2(S^T c -
// lse log2 e), zero where query < key or query >= seq, the mask only on tiles that hold such
// (WithMask).
template <int kM>
__device__ __forceinline__ void ApplyProbabilities(float (&pt)[kM / 2],
                                                   const float2 (&query_lse)[kM / 8],
                                                   const TileAt& at, int k0,
                                                   const ConsumerThread& me, const Dims& s) {
  const auto probabilities = [&](auto masked) {
#pragma unroll
    for (int i = 0; i < kM / 8; ++i) {
#pragma unroll
      for (int r = 4 * i; r < 4 * i + 4; ++r) {
        float prob = Exp2(pt[r] * s.scale_log2 - (r % 2 == 0 ? query_lse[i].x : query_lse[i].y));
        if constexpr (decltype(masked)::value) {
          const int query = at.row0 + ConsumerThread::Column(i, r % 2);
          if (query < me.Row(k0, r / 2 % 2) || query >= s.seq) prob = 0.0f;
        }
        pt[r] = prob;
      }
    }
  };
  WithMask(at.row0 < k0 + kBlockRows - 1 || at.row0 + kM > s.seq, probabilities);
}

// dS^T = P^T (dP^T - delta) in place of dP^T.
template <int kM>
__device__ __forceinline__ void ApplyDeltas(float (&dpt)[kM / 2], const float (&pt)[kM / 2],
                                            const float2 (&query_delta)[kM / 8]) {
#pragma unroll
  for (int i = 0; i < kM / 8; ++i) {
#pragma unroll
    for (int r = 4 * i; r < 4 * i + 4; ++r)
      dpt[r] = pt[r] * (dpt[r] - (r % 2 == 0 ? query_delta[i].x : query_delta[i].y));
  }
}

// A dk/dv consumer thread's dk and dv (its warpgroup's 64 keys from k0, as wgmma accumulators)
// over the CTA's num_tiles query tiles (query_tiles, of sequence b): per tile S^T and dP^T, then
// P^T, dV += P^T dout, dS^T and dK += dS^T Q, each stage released once its products are done.
// Lane l's lse and delta of queries l and l + 32 are loaded an iteration ahead and nothing is
// computed from them there (so no instruction waits for the loads before the next iteration),
// put in the warp's shared floats (lse times log2 e) once the score products are issued; each
// thread then reads its columns' values there as 8 pairs (8 i + 2 t, + 1), half of them before
// the wait for the products they follow, so that the shared loads' latency hides behind it (all
// of them before: two registers spill; all after: the loads' latency is exposed).
template <int D>
__device__ __forceinline__ void AccumulateKvGradients(
    const BackwardKvSmem<D>& smem, const float* lse, const float* delta, const Dims& s, int b,
    int k0, const QueryTileWalk<kBackwardStreamRows>& query_tiles, int num_tiles,
    const ConsumerThread& me, float (&dk)[D / 2], float (&dv)[D / 2]) {
  constexpr int kM = kBackwardStreamRows;
  const uint32_t k_rows = me.Rows(smem.Resident(0)), v_rows = me.Rows(smem.Resident(1));
  float* const warp_stats = smem.WarpFloats(me.ConsumerWarp());  // lse log2 e, then delta
  Zero(dk);
  Zero(dv);
  // P^T and dS^T as the bf16 A operands of the dV and dK products; each stays untouched until its
  // product has completed (ptxas keeps registers an in-flight wgmma reads).
  uint32_t p_packed[kM / 16][4], ds_packed[kM / 16][4];
  MbarrierWait(smem.ResidentFull(), 0);
  PipelineState<kStages> state, previous;
  QueryTileWalk<kM> walk = query_tiles;
  TileAt at = walk.Next();
  QueryStats stats = LoadQueryStats(lse, delta, s, b, at, me.lane);
  for (int it = 0; it < num_tiles; ++it) {
    // Zeroed, though the first wgmma overwrites them: otherwise ptxas carries the last tile's
    // values into the products' operands and waits for the wgmmas in flight to do so (C7517).
    float pt[kM / 2], dpt[kM / 2];
    Zero(pt);
    Zero(dpt);
    MbarrierWait(smem.Full(0, state.stage), state.phase);
    IssueScores<D, kM>(pt, k_rows, smem.Streamed(0, state.stage));
    MbarrierWait(smem.Full(1, state.stage), state.phase);
    IssueScores<D, kM>(dpt, v_rows, smem.Streamed(1, state.stage));
    ShareQueryStats<kM>(warp_stats, stats, me.lane);
    if (it > 0) {
      WgmmaWaitGroup<2>();  // the last tile's dK product is done: its Q stage is free
      FenceAccumulators(dk);
      me.Release(smem.Empty(0, previous.stage));
    }
    float2 query_lse[kM / 8];
    ReadQueryStats<kM>(warp_stats, 0, 0, kM / 16, query_lse);
    WgmmaWaitGroup<1>();
    FenceAccumulators(pt);
    ReadQueryStats<kM>(warp_stats, 0, kM / 16, kM / 8, query_lse);
    ApplyProbabilities<kM>(pt, query_lse, at, k0, me, s);
    IssueProducts<D, kM>(dv, pt, smem.Streamed(1, state.stage), p_packed);
    float2 query_delta[kM / 8];
    ReadQueryStats<kM>(warp_stats, 1, 0, kM / 16, query_delta);
    WgmmaWaitGroup<1>();  // dP^T has landed; the dV product may still run
    FenceAccumulators(dpt);
    ReadQueryStats<kM>(warp_stats, 1, kM / 16, kM / 8, query_delta);
    ApplyDeltas<kM>(dpt, pt, query_delta);
    IssueProducts<D, kM>(dk, dpt, smem.Streamed(0, state.stage), ds_packed);
    if (it + 1 < num_tiles) {
      at = walk.Next();
      stats = LoadQueryStats(lse, delta, s, b, at, me.lane);
    }
    WgmmaWaitGroup<1>();  // the dV product is done: this tile's dout stage is free
    FenceAccumulators(dv);
    me.Release(smem.Empty(1, state.stage));
    previous = state;
    state.Advance();
  }
  WgmmaWaitGroup<0>();
  FenceAccumulators(dk);
  me.Release(smem.Empty(0, previous.stage));
}

// A consumer thread's dk and dv as f32 into the CTA's shared memory (`partial`: PartialOffset's
// layout), once both consumers are done with every tile (the producer loads nothing more).
template <int D>
__device__ __forceinline__ void WriteKvPartials(float* partial, const ConsumerThread& me,
                                                const float (&dk)[D / 2],
                                                const float (&dv)[D / 2]) {
  NamedBarrierSync(3, 256);
#pragma unroll
  for (int r = 0; r < D / 2; r += 2) {
    const int row = me.consumer * 64 + me.LocalRow(r / 2 % 2);
    const int column = ConsumerThread::Column(r / 4, 0);
    *reinterpret_cast<float2*>(partial + PartialOffset<D>(0, row, column)) =
        make_float2(dk[r], dk[r + 1]);
    *reinterpret_cast<float2*>(partial + PartialOffset<D>(1, row, column)) =
        make_float2(dv[r], dv[r + 1]);
  }
}

// CTA `rank`'s share of the result once every CTA of the cluster has written its partial sums:
// key rows [rank 128 / split, (rank + 1) 128 / split) from k0 (before seq) of dk and dv (b, kvh),
// each the sum of the CTAs' partials in rank order (distributed shared memory), dk scaled by
// 1 / sqrt(d), stored as bf16; the consumer threads call it.
template <int D>
__device__ __forceinline__ void StoreKvClusterSums(cooperative_groups::cluster_group& cluster,
                                                   float* partial, bf16* dk_out, bf16* dv_out,
                                                   const Dims& s, int b, int kvh, int k0, int rank,
                                                   int split) {
  const int row_lo = rank * kBlockRows / split, row_hi = (rank + 1) * kBlockRows / split;
  constexpr int kChunks = D / 4;  // float4 pieces per row
  for (int i = threadIdx.x - 128; i < 2 * (row_hi - row_lo) * kChunks; i += 256) {
    const int which = i / ((row_hi - row_lo) * kChunks);  // 0: dk, 1: dv
    const int j = i % ((row_hi - row_lo) * kChunks);
    const int row = row_lo + j / kChunks, column = j % kChunks * 4;
    if (k0 + row >= s.seq) continue;
    const int offset = PartialOffset<D>(which, row, column);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int r = 0; r < split; ++r) {
      const float4 part =
          *reinterpret_cast<const float4*>(cluster.map_shared_rank(partial, r) + offset);
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    const float scale = which == 0 ? s.scale : 1.0f;
    bf16* dst =
        (which == 0 ? dk_out : dv_out) + RowOffset(b, k0 + row, kvh, s.seq, s.kv_heads, D) + column;
    reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(sum.x * scale, sum.y * scale);
    reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(sum.z * scale, sum.w * scale);
  }
}

// dk, dv of 128 keys: grid (key tiles, batch * kv_heads * split) in clusters of (1, split, 1);
// the longest (first key tiles) first (LongestFirst). Each CTA of a cluster takes `group / split`
// of the GQA group's query heads and, for each, the query tiles at or after its keys: S^T = K Q^T,
// P^T = exp2(S^T c - lse log2 e) (zero where query < key or query >= seq), dP^T = V dout^T, dV +=
// P^T dout, dS^T = P^T (dP^T - delta), dK += dS^T Q, keys the rows throughout (K and V resident, Q
// and dout streamed). At the end the CTAs of the cluster add their partial sums in rank order
// through distributed shared memory, CTA r the rows [r 128 / split, (r + 1) 128 / split), scale
// dk by 1 / sqrt(d) and store bf16: deterministic.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90BackwardKvKernel(const __grid_constant__ CUtensorMap k_map,
                         const __grid_constant__ CUtensorMap v_map,
                         const __grid_constant__ CUtensorMap q_map,
                         const __grid_constant__ CUtensorMap dout_map, const float* lse,
                         const float* delta, bf16* dk_out, bf16* dv_out, Dims s, int split) {
#if MOE_SM90A_KERNELS
  constexpr int kM = kBackwardStreamRows;
  using Smem = BackwardKvSmem<D>;
  static_assert(2 * kBlockRows * D * 4 <= Smem::kDataBytes, "the partial sums reuse the tiles");
  extern __shared__ uint8_t smem_raw[];
  const Smem smem(smem_raw);
  float* partial = smem.template Generic<float>(smem.base);
  const GridPlace place = LongestFirst(split);
  const int k0 = place.rank * kBlockRows;
  const int rank = blockIdx.y % split;  // in the cluster
  const int b = place.group / s.kv_heads, kvh = place.group % s.kv_heads;
  const int heads_per_cta = s.heads / s.kv_heads / split;
  const int head0 = (kvh * split + rank) * heads_per_cta;
  // The query tiles at or after these keys (those before see none of them), head by head.
  const int first_row = k0 / kM * kM, end_row = (s.seq + kM - 1) / kM * kM;
  const int num_tiles = heads_per_cta * ((end_row - first_row) / kM);
  const QueryTileWalk<kM> query_tiles{{head0, first_row}, first_row, end_row};

  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (!IsConsumer(smem)) {
    if (threadIdx.x == 0) {
      const CUtensorMap* const resident[2] = {&k_map, &v_map};
      const CUtensorMap* const streamed[2] = {&q_map, &dout_map};
      QueryTileWalk<kM> walk = query_tiles;
      Produce(smem, resident, {kvh, k0}, streamed, b, num_tiles, [&](int) { return walk.Next(); });
    }
    __syncwarp();
    cluster.sync();  // the partial sums are written
    cluster.sync();  // and read
    return;
  }

  const ConsumerThread me;
  float dk[D / 2], dv[D / 2];
  AccumulateKvGradients<D>(smem, lse, delta, s, b, k0, query_tiles, num_tiles, me, dk, dv);
  // Both consumers are done with every tile (the producer loads nothing more): the shared
  // memory takes the partial sums.
  WriteKvPartials<D>(partial, me, dk, dv);
  cluster.sync();
  StoreKvClusterSums<D>(cluster, partial, dk_out, dv_out, s, b, kvh, k0, rank, split);
  cluster.sync();  // no CTA leaves while another reads its shared memory
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

dim3 QueryBlockGrid(const Dims& s) {
  return dim3((s.seq + kBlockRows - 1) / kBlockRows, s.batch * s.heads);
}

template <int D>
bool Forward(const ForwardParams<bf16>& p, cudaStream_t stream) {
  CUtensorMap q_map, k_map, v_map, out_map;
  const Dims& s = p.dims;
  if (!HeadMap(&q_map, p.q, s, s.heads, D, kBlockRows) ||
      !HeadMap(&k_map, p.k, s, s.kv_heads, D, kForwardKvRows) ||
      !HeadMap(&v_map, p.v, s, s.kv_heads, D, kForwardKvRows) ||
      !HeadMap(&out_map, p.out, s, s.heads, D, 64)) {
    return false;
  }
  LaunchInClusters(Sm90ForwardKernel<D>, QueryBlockGrid(s), kThreads, ForwardSmem<D>::kBytes, 1,
                   stream, q_map, k_map, v_map, out_map, p.lse, s);
  return true;
}

template <int D>
bool Backward(const BackwardParams<bf16>& p, cudaStream_t stream) {
  constexpr int kN = kBackwardStreamRows;
  const Dims& s = p.dims;
  // Resident (128-row boxes), streamed (64-row boxes) and stored (64-row boxes) maps.
  CUtensorMap q_resident, dout_resident, k_resident, v_resident;
  CUtensorMap q_streamed, dout_streamed, k_streamed, v_streamed, dq_map;
  if (!HeadMap(&q_resident, p.q, s, s.heads, D, kBlockRows) ||
      !HeadMap(&dout_resident, p.dout, s, s.heads, D, kBlockRows) ||
      !HeadMap(&k_resident, p.k, s, s.kv_heads, D, kBlockRows) ||
      !HeadMap(&v_resident, p.v, s, s.kv_heads, D, kBlockRows) ||
      !HeadMap(&q_streamed, p.q, s, s.heads, D, kN) ||
      !HeadMap(&dout_streamed, p.dout, s, s.heads, D, kN) ||
      !HeadMap(&k_streamed, p.k, s, s.kv_heads, D, kN) ||
      !HeadMap(&v_streamed, p.v, s, s.kv_heads, D, kN) ||
      !HeadMap(&dq_map, p.dq, s, s.heads, D, 64)) {
    return false;
  }
  const int split = ClusterSplit(s.heads / s.kv_heads);
  const dim3 kv_grid((s.seq + kBlockRows - 1) / kBlockRows, s.batch * s.kv_heads * split);
  LaunchInClusters(Sm90BackwardKvKernel<D>, kv_grid, kThreads, BackwardKvSmem<D>::kBytes, split,
                   stream, k_resident, v_resident, q_streamed, dout_streamed, p.lse, p.delta, p.dk,
                   p.dv, s, split);
  LaunchInClusters(Sm90BackwardQKernel<D>, QueryBlockGrid(s), kThreads, BackwardQSmem<D>::kBytes, 1,
                   stream, q_resident, dout_resident, k_streamed, v_streamed, dq_map, p.lse,
                   p.delta, s);
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

bool TryAttentionBackwardSm90(const BackwardParams<bf16>& params, int head_dim,
                              cudaStream_t stream) {
  // At head dim 64 the mma.sync backward is the faster, so these kernels take head dim 128 only.
  return head_dim == 128 && Sm90Runs() && Backward<128>(params, stream);
}

}  // namespace moe::cuda::attention
