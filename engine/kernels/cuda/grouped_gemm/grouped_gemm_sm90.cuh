// Hopper (sm_90a) grouped GEMMs for the MoE expert layers: wgmma.mma_async on operands that TMA
// loads into 128-byte-swizzled shared memory, one persistent launch per GEMM over all groups.
// Self-contained (CUDA headers only) so that tests/kernels/grouped_gemm_sm90_probe.cu builds it
// with one nvcc command; the engine's CUDA GroupedMatmul and GroupedMatmulWeightGrad reach it
// through grouped_matmul_sm90.h (contracts: op_declarations.inc).
//
// Operations (row-major, bf16 operands, fp32 accumulation; group g owns the token rows
// [offsets[g], offsets[g + 1]), offsets (groups + 1) int32 in DEVICE memory, 0 = offsets[0] <=
// ... <= offsets[groups] = rows; the kernels trap on offsets that decrease or leave [0, rows]):
//   GroupedMatmulSm90:           y[rows of g] = x[rows of g] · op(w_g)            (=, bf16 y)
//     x (rows, k); w (groups, n, k) with transpose_w (y = x w_g^T), else (groups, k, n)
//     (y = x w_g); y (rows, n). Every row of y is written (k == 0 writes zeros).
//   GroupedMatmulSwigluSm90:     the same with transpose_w for fc1, w (groups, 2 f, k) = [gate |
//     up] rows, and a (rows, f) = silu(gate) * up * scale[row] of y's halves     (=, bf16 y, a)
//   GroupedMatmulSwigluBackwardSm90: fc2's data gradient da = dy · w_g (w (groups, k, f)), not
//     stored, and from it SwiGLU's gradients dh (rows, 2 f) and dscale (rows)   (=, bf16 dh, f32)
//   GroupedMatmulWeightGradSm90: dw_g (+)= sum over parts p of dy_p[rows of g]^T · x_p[rows of g]
//     (+= or =, f32/bf16 dw). Up to kMaxWeightGradParts parts of token rows (WeightGradRows:
//     say micro-batches, so that one pass over dw sums them), each dy_p (rows_p, n), x_p (rows_p,
//     k) with its own offsets; dw (groups, n, k) f32 or bf16 (the launcher's Out); a bf16 dw
//     gets the f32 accumulators rounded to nearest even (cvt.rn.bf16x2.f32). accumulate: TMA
//     reduce-add (cp.reduce.async.bulk.tensor .add on the tensor map's type: the add happens in
//     L2, exactly one add per dw element per call, so results are run-to-run identical), and a
//     group without rows leaves dw_g as it is. f32: NOT verified whether it flushes subnormals
//     as red.global.add.f32 does. bf16: L2 adds the rounded bf16 product to the bf16 dw value
//     and stores bf16, so += rounds twice (product, then sum); the precision and rounding of that
//     add are not documented for the tensor form: not verified (the PTX ISA says "rounds to the
//     nearest even" only of the non-tensor cp.reduce.async.bulk .add). Otherwise TMA stores (=,
//     dw is only written: half the memory traffic of +=), and a group without rows gets zeros.
//     (A load-add-store epilogue by the consumer threads was 1.5x slower than the reduce-add at
//     the Qwen3 shape with f32 dw on the H200, 2026-11-30.)
//   Requirements (the launchers return cudaErrorInvalidValue otherwise): n and k multiples of 8
//   and base pointers 16-byte aligned (TMA: global strides and addresses multiples of 16 bytes);
//   rows, n, k < 2^31; the forward needs groups <= kMaxGroups.
//
// Design (one CTA per SM, persistent, in clusters of 2; static round-robin per cluster over a
// linear tile order):
//   - CTA = 3 warpgroups: warpgroup 0 produces (one warp issues TMA into a ring of shared
//     stages, 3 deep for the forward (4 for fc2's: ForwardPipeline), 4 for the weight gradient,
//     setmaxnreg 40), warpgroups 1 and 2 consume (setmaxnreg 232): each owns 64 rows of the 128 x
//     256 C tile and issues m64n256k16 wgmmas, 128 f32 accumulators a thread.
//   - Stage = A 128 x 64 + B 256 x 64 bf16 (48 KiB); full[s] (TMA bytes landed) and empty[s]
//     (the 8 consumer warps of each CTA of the cluster done reading) mbarriers; the producer
//     runs ahead across tiles, so the next tile's loads overlap this tile's epilogue.
//   - Forward with SwiGLU: warps 1-3 of the producer warpgroup (otherwise idle) compute a from
//     each consumer's staged y tile while the consumer runs its next mainloop; for the SwiGLU
//     gradient they compute dh from the staged da tile and h, which they prefetch into L2.
//   - Epilogue: each consumer stages its result in shared memory as TMA boxes and issues their
//     writes without waiting for them (WriteTile; the forward stages all of it, so its writes
//     drain during the next tile's mainloop); the forward's rows at a group's end, which TMA
//     cannot stop short of, are copied from the staging by the threads (WriteRows).
//   - L2 policies (TMA .L2::cache_hint): outputs (y, dw) evict_first, as nothing here reads them
//     again; the forward's w tiles and the weight gradient's operands evict_last (other row tiles
//     or column tiles of the group read them again); the forward's x rows normal. In the probe
//     (random routing, one H200, 2026-12-03; ms, without -> with): the weight gradients with an
//     f32 dw (=) at DeepSeek-V3-like fc1 10.59-10.72 -> 9.42 and fc2 5.93-5.95 -> 5.54 (4096
//     tokens), 17.55 -> 16.85 and 8.83 -> 8.44 (16384), Qwen3-30B-A3B fc1 0.603-0.607 -> 0.590;
//     fc2's data gradient at Qwen3 0.267 -> 0.222, fc1 0.415 -> 0.403 (w evict_last).
//   - Forward: clusters of 2 CTAs (kForwardCluster) that load a shared operand once and multicast
//     it (TMA .multicast::cluster) into both: a row pair (two 128-row tiles of one group over the
//     same 256 columns) shares w's tile, each CTA loading half; a group's odd last row tile runs
//     as column pairs (the same 128 rows, 512 columns) sharing x's rows. Each CTA's stage gets
//     48 KiB from its own and its peer's loads; a stage is empty once the consumer warps of both
//     CTAs released it (remote mbarrier arrivals), and no CTA exits before its peer (cluster
//     barrier). Without the pairing, the row tiles that share a weight tile ran on CTAs that
//     drifted apart, and each read it from DRAM: at the DeepSeek-V3-like shape (16384 tokens, 4
//     row tiles per expert) fc1 read 84 GB for 15 GB of weights (L2 hit rate 32%, ncu, H200,
//     2026-12-02).
//   - Forward tiles (grouped_gemm_tiles.h, tested on the host): group-major; within a group the
//     row pairs of a column tile are consecutive (the clusters resident together read one weight
//     tile from L2), then the column pairs. Each CTA scans the offsets once into shared memory
//     (prefix of cluster tiles per group) and binary-searches it per tile. A row tile never crosses
//     its group's end: rows past it are loaded (from the next group, or TMA's zero fill past
//     `rows`) but never stored; a consumer whose 64 rows all lie past the end, or whose columns lie
//     past n, skips its wgmmas. K tails and N tails: TMA zero-fills outside the tensors (w is a 3-D
//     map with the group as its outer dimension, so no read crosses into the next expert).
//   - The forward's last, partial wave (grouped_gemm_tiles.h's TailSplit, tested on the host): the
//     last T mod C of T cluster tiles on C clusters run split along K in pieces, one per otherwise
//     idle cluster; pieces 1.. write their f32 accumulators to the caller's SplitWorkspace
//     (thread-major, coalesced, through L2) and raise a flag (st.release.gpu after bar.sync);
//     piece 0 waits for each flag (ld.acquire.gpu, then bar.sync) and clears it for the next
//     launch, adds the partials in piece order (run-to-run identical) and runs the tile's epilogue.
//     The writer pieces run first, in the first round, so piece 0, in the last, finds them done.
//     Plain products only (y = x · op(w)): the SwiGLU kernels keep every tile whole (slower with
//     it, see GroupedMatmulKernel).
//   - Weight-gradient tiles: (group, 128 rows of n, 256 columns of k); K = the group's rows in
//     each part in turn, in 64-row steps (each part's last step as below). Clusters of 2
//     CTAs (kWeightGradCluster) take two tiles stacked along n, which share x's 256 columns: each
//     CTA loads its own dy columns and half of x's, multicast into both (the same stage protocol as
//     the forward's). Order (grouped_gemm_tiles.h, tested on the host): group-major, then bands of
//     row pairs where the average group's dy outgrows L2. A part's last K step of a group holds
//     rows past the group's end (the next group's): the consumers skip the stage's 16-row wgmma
//     slices that hold none of the group's rows (PartSlices), and where the last slice they read
//     is partly past the end, the producer lands the stage on a separate mbarrier, zeroes the
//     128-byte lines of those rows in every box (both operands, so Inf/NaN in a neighbour cannot
//     leak as 0 * Inf), fences (fence.proxy.async) and only then arrives on full[s]; each CTA
//     masks its own copy of the stage.
//
// Key facts relied on (PTX ISA 8.x wgmma / cp.async.bulk.tensor; CUTLASS cute GMMA traits):
//   - TMA with CU_TENSOR_MAP_SWIZZLE_128B and a 128-byte inner box writes box row r at byte
//     r * 128 and its 16-byte chunk c at chunk c ^ (r % 8) (address bits [4,7) ^= bits [7,10));
//     every box here starts 1024-byte aligned, so the pattern is the same for TMA and wgmma.
//     Out-of-bounds box elements are zero-filled and still count toward complete_tx bytes.
//   - wgmma descriptor: bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45
//     stride byte offset >> 4, 49-51 base offset (0: every start has address bits 7-9 zero),
//     62-63 swizzle (1 = 128B).
//   - Canonical layouts in elements, T = 8 bf16 (16 bytes), before the swizzle:
//     K-major 128B-swizzle ((8,m),(T,2k)):((8T,SBO),(1,T)): rows of 64 bf16 (128 B), 8-row
//     groups SBO = 1024 B apart; LBO unused (set to 16 B, as CUTLASS does); the k-th 16-wide K
//     slice of a 64-wide stage starts 32 k bytes further.
//     MN-major 128B-swizzle ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): each K row holds 64 MN
//     values (128 B); 8-row groups SBO = 1024 B apart; 64-wide MN blocks LBO apart (one TMA box
//     of 64 x 64 each: 8192 B); the k-th 16-row K slice starts 2048 k bytes further.
//     wgmma's imm-trans-a / imm-trans-b = 1 selects MN-major (bf16 allows it), 0 K-major.
//   - m64nNk16 f32 accumulator: warp w of the warpgroup, lane = 4 g + t, register 4 i + 2 h + j
//     holds row 16 w + g + 8 h, column 8 i + 2 t + j (CUTLASS CLayout_64xN).
//   - cp.reduce.async.bulk.tensor has no type qualifier: the element type is the tensor map's,
//     and its table of valid .redOp and element types lists .add for .f32, .f16 and .bf16 (PTX
//     ISA 9.1). The .noftz that .add.bf16 requires belongs to the non-tensor
//     cp.reduce.async.bulk only; the tensor form's syntax has none.
//   - mbarrier phases: a fresh barrier is in phase 0; try_wait.parity(P) returns once the phase
//     with parity P has completed, and parity 1 counts as completed before the first phase
//     does, so the producer's first pass over the empty barriers (waiting parity phase ^ 1 = 1)
//     does not block. Consumers wait full[s] with parity `phase`, which flips each ring pass.
//   - Accumulator registers: the compiler does not know that wgmma writes them asynchronously,
//     so FenceAccumulators (an empty asm that "modifies" them) pins every C++ access to them
//     between wgmma.wait_group and the next wgmma.fence.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/layers/swiglu_math.cuh"

namespace moe::cuda::sm90 {

using bf16 = __nv_bfloat16;

constexpr int kBlockK = 64;  // reduction step: 64 bf16 = one 128-byte swizzle row
constexpr int kWgmmaK = 16;
constexpr int kForwardStages = 3;       // 3 x 48 KiB, beside the output staging and the offsets
constexpr int kForwardCluster = 2;      // forward CTAs sharing (multicasting) an operand tile
constexpr int kWeightGradStages = 4;    // 4 x 48 KiB, beside the output staging
constexpr int kWeightGradCluster = 2;   // weight-gradient CTAs sharing (multicasting) x's tile
constexpr int kMaxWeightGradParts = 8;  // parts of rows one weight-gradient launch sums
constexpr int kConsumers = 2;
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
constexpr int kConsumerWarps = kConsumers * 4;
constexpr int kAccumulators = 64 * kBlockN / kWarpgroupThreads;  // f32 per consumer thread
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kMaxGroups = 1024;  // forward: the per-CTA copies of the offsets in shared memory

constexpr int kSwizzleRowBytes = 128;
constexpr int kBoxBytes = 64 * kSwizzleRowBytes;  // 64 rows of 128 B (64 bf16, 32 f32): 8 KiB
constexpr int kStageABytes = kBlockM * kBlockK * 2;
constexpr int kStageBBytes = kBlockN * kBlockK * 2;
constexpr int kStageBytes = kStageABytes + kStageBBytes;
constexpr int kKMajorSliceBytes = kWgmmaK * 2;                  // next 16 K values in a row
constexpr int kMNMajorSliceBytes = kWgmmaK * kSwizzleRowBytes;  // next 16 K rows
constexpr int kCoreGroupBytes = 8 * kSwizzleRowBytes;           // SBO: the next 8 rows

// Output TMA writes (store, or reduce-add for dw +=): each consumer stages its 64 x 256 result
// (element type Out) in its own shared memory, as TMA boxes of 64 rows x kWriteColumns<Out>
// columns (one 128-byte swizzle row per tile row: 32 f32 or 64 bf16), in rounds of as many columns
// as its staging holds, and issues their writes without waiting for them: they drain while it
// goes on. Before a round refills the staging it waits until the previous round's writes have
// read it.
//   - Forward (y, bf16): the whole result, one round, so a tile's writes drain during the next
//     tile's mainloop (3 stages instead of 4 make room); fc2's forward: one box, 4 rounds, beside
//     4 stages (ForwardPipeline). From registers (st.global per thread) they made the Mixtral
//     fc1 forward 10% and the Qwen3 fc2 forward 45% slower than with no writes at all (2.82 vs
//     2.57 ms, 0.256 vs 0.177 ms, H200, 2026-12-02).
//   - Weight gradient (dw, f32 or bf16): 16 KiB, 4 f32 or 2 bf16 rounds, beside 4 stages. (The
//     whole bf16 result beside 3 stages, measured the same day: faster for dw = (Mixtral fc1
//     2.95 -> 2.84 ms), slower for += (3.25 -> 3.49) and for f32.)
template <typename Out>
constexpr int kWriteColumns = kSwizzleRowBytes / sizeof(Out);
constexpr int kForwardStagingBytes = 64 * kBlockN * sizeof(bf16);  // per consumer: 32 KiB
constexpr int kWeightGradStagingBytes = 2 * kBoxBytes;             // per consumer: 16 KiB

static_assert(kBlockK * 2 == kSwizzleRowBytes);
static_assert(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0 && kBoxBytes % 1024 == 0);
static_assert(kBlockM == 64 * kConsumers && kBlockN % 64 == 0 && kBlockN / 8 * 4 == kAccumulators);
// setmaxnreg moves registers between the warpgroups within what the CTA got at launch (168 a
// thread): .inc waits until others have released enough, so a larger sum deadlocks.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
static_assert(kProducerRegisters * kWarpgroupThreads +
                  kConsumerRegisters * kWarpgroupThreads * kConsumers <=
              kLaunchRegisters * kThreads);

// The token rows of one weight-gradient launch, in up to kMaxWeightGradParts parts (say the
// micro-batches whose gradients it sums), each with its own dy, x and offsets: a kernel parameter
// (__grid_constant__), so the tensor maps stay in parameter space, where TMA reads them.
struct WeightGradParts {
  CUtensorMap dy[kMaxWeightGradParts];  // dy_p as (n, rows_p), box (64, 64)
  CUtensorMap x[kMaxWeightGradParts];   // x_p as (k, rows_p), box (64, 64)
  const int32_t* offsets[kMaxWeightGradParts];
  int rows[kMaxWeightGradParts];
  int count;  // 1 <= count <= kMaxWeightGradParts, each part with rows
};

// The plain products' (GroupedMatmulSm90's) workspace for their split tail tiles
// (grouped_gemm_tiles.h, TailSplit): per slot, each CTA rank's and consumer warpgroup's partial
// accumulators (thread-major: value i of thread j at i * kWarpgroupThreads + j), and a flag each
// that they are written: 0 before a launch, and every launch leaves them 0 (its reader of a flag
// clears it), so only a new workspace is cleared (AllocateSplitWorkspace). slots 0: no split.
// SplitSlots(SMs) slots suffice on a device of that many SMs (a split's writer pieces number fewer
// than the clusters).
struct SplitWorkspace {
  float* partials;  // slots x kSplitSlotParts x kSplitPartFloats
  int* flags;       // slots x kSplitSlotParts
  int slots;
};
constexpr int kSplitSlotParts = kForwardCluster * kConsumers;
constexpr int kSplitPartFloats = kAccumulators * kWarpgroupThreads;
inline int SplitSlots(int sm_count) { return sm_count / kForwardCluster; }
// A workspace for the SMs of `device` (the current device) in new device memory (cudaMalloc; the
// caller keeps it), its flags cleared (cudaMemset: ready for its first launch).
inline cudaError_t AllocateSplitWorkspace(int device, SplitWorkspace* workspace) {
  int sm_count = 0;
  cudaError_t status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;
  const int slots = SplitSlots(sm_count);
  const int64_t partial_floats = int64_t{slots} * kSplitSlotParts * kSplitPartFloats;
  const size_t flag_bytes = sizeof(int) * slots * kSplitSlotParts;
  void* bytes = nullptr;
  status = cudaMalloc(&bytes, partial_floats * sizeof(float) + flag_bytes);
  if (status != cudaSuccess) return status;
  float* const partials = static_cast<float*>(bytes);
  *workspace = {partials, reinterpret_cast<int*>(partials + partial_floats), slots};
  return cudaMemset(workspace->flags, 0, flag_bytes);
}

namespace detail {

using Accumulators = float[kAccumulators];

// ---------------------------------------------------------------- shared-memory operands

// Rows of 64 K values (a token-row tile, or (out, in) weight rows) as TMA lays out one box.
__device__ __forceinline__ uint64_t KMajorDescriptor(uint32_t start, int k_slice) {
  return SmemDescriptor(start + k_slice * kKMajorSliceBytes, 16, kCoreGroupBytes);
}

// K rows of 64 M or N values, in 64 x 64 boxes kBoxBytes apart along M or N.
__device__ __forceinline__ uint64_t MNMajorDescriptor(uint32_t start, int k_slice) {
  return SmemDescriptor(start + k_slice * kMNMajorSliceBytes, kBoxBytes, kCoreGroupBytes);
}

// ---------------------------------------------------------------- pipeline

// Bytes of a stage ring's mbarriers (StageBarriers): three per stage.
template <int kStages>
constexpr int kStageBarrierBytes = 3 * kStages * 8;

// The mbarriers of the stage ring: full[s] (operands landed), empty[s] (consumers done), and
// landed[s] (weight gradient only: the TMA bytes of a stage the producer still has to mask).
// A stage is filled by every CTA of the cluster (multicast), so it is empty once the consumers
// of all of them are done: each consumer warp releases it in every CTA.
template <int kStages, int kCluster>
struct StageBarriers {
  uint32_t base;  // shared address of full[0]; empty and landed follow, kStages each

  __device__ uint32_t Full(int stage) const { return base + 8 * stage; }
  __device__ uint32_t Empty(int stage) const { return base + 8 * (kStages + stage); }
  __device__ uint32_t Landed(int stage) const { return base + 8 * (2 * kStages + stage); }

  __device__ void Init() const {
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(Full(s), 1);
      MbarrierInit(Empty(s), kConsumerWarps * kCluster);
      MbarrierInit(Landed(s), 1);
    }
    FenceBarrierInit();
  }

  // One consumer warp's arrival on empty[stage] (in every CTA of the cluster).
  __device__ void Release(int stage) const {
#pragma unroll
    for (int rank = 0; rank < kCluster; ++rank) MbarrierArriveInCta(Empty(stage), rank);
  }
};

// Dynamic shared memory, 1024-byte aligned for the swizzle atoms: stage s's A at
// A(s), its B at B(s), then the barriers, then what each kernel adds.
template <int kStages>
struct StageRing {
  uint8_t* base;

  __device__ explicit StageRing(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                        ~uintptr_t{1023})) {}

  __device__ uint8_t* APointer(int stage) const { return base + stage * kStageABytes; }
  __device__ uint8_t* BPointer(int stage) const {
    return base + kStages * kStageABytes + stage * kStageBBytes;
  }
  __device__ uint32_t A(int stage) const { return SmemAddress(APointer(stage)); }
  __device__ uint32_t B(int stage) const { return SmemAddress(BPointer(stage)); }
  template <int kCluster>
  __device__ StageBarriers<kStages, kCluster> Barriers() const {
    return {SmemAddress(base) + kStages * kStageBytes};
  }
  // Bytes past the barriers, for the kernel's own use (1024-byte aligned).
  __device__ uint8_t* Extra() const {
    return base + kStages * kStageBytes + ((kStageBarrierBytes<kStages> + 1023) & ~1023);
  }
  static constexpr int kBytesBeforeExtra =
      1023 + kStages * kStageBytes + ((kStageBarrierBytes<kStages> + 1023) & ~1023);
};

// Every stage's K slices hold data (MultiplyStages' default).
struct WholeStages {
  __device__ int operator()() const { return kBlockK / kWgmmaK; }
};

// Consumer side of k_blocks stages: this warpgroup's 64 x 256 accumulators = A · B over them
// when `active` (a_descriptor(stage, k_slice), b_descriptor(stage, k_slice) give the operands);
// an inactive warpgroup (its rows lie outside C) only releases the stages. stage_slices(),
// called once per stage in order, says how many of its 16-deep K slices hold data (1 to 4,
// warpgroup-uniform); the slices after them are skipped (whatever they hold). Keeps one wgmma
// group in flight: a stage is released once the group after it has been issued and its own
// group has completed. Every consumer warp arrives once per stage on empty.
template <int kTransposeA, int kTransposeB, int kStages, int kCluster, typename ADescriptor,
          typename BDescriptor, typename StageSlices = WholeStages>
__device__ __forceinline__ void MultiplyStages(Accumulators& acc, int k_blocks, bool active,
                                               const StageBarriers<kStages, kCluster>& barriers,
                                               PipelineState<kStages>& state,
                                               ADescriptor a_descriptor, BDescriptor b_descriptor,
                                               StageSlices stage_slices = {}) {
  const bool warp_leader = threadIdx.x % 32 == 0;
  int unreleased = -1;  // the stage whose wgmma group may still be reading it
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int slices = stage_slices();
    MbarrierWait(barriers.Full(state.stage), state.phase);
    if (active) {
      // One straight wgmma sequence per slice count: ptxas fences every wgmma of a sequence
      // with branches inside it.
      const auto issue = [&]<int kSlices>() {
        FenceAccumulators(acc);
        WgmmaFence();
#pragma unroll
        for (int slice = 0; slice < kSlices; ++slice) {
          WgmmaSS<kTransposeA, kTransposeB>(acc, a_descriptor(state.stage, slice),
                                            b_descriptor(state.stage, slice), kb > 0 || slice > 0);
        }
        WgmmaCommitGroup();
      };
      static_assert(kBlockK / kWgmmaK == 4);
      if (slices >= 4) {
        issue.template operator()<4>();
      } else if (slices == 3) {
        issue.template operator()<3>();
      } else if (slices == 2) {
        issue.template operator()<2>();
      } else {
        issue.template operator()<1>();
      }
      WgmmaWaitGroup<1>();
      FenceAccumulators(acc);
      if (unreleased >= 0 && warp_leader) barriers.Release(unreleased);
      unreleased = state.stage;
    } else if (warp_leader) {
      barriers.Release(state.stage);
    }
    state.Advance();
  }
  // Also when inactive (nothing in flight: returns at once), so that every path to the
  // accumulators' next use passes a wait and ptxas need not inject one.
  WgmmaWaitGroup<0>();
  FenceAccumulators(acc);
  if (unreleased >= 0 && warp_leader) barriers.Release(unreleased);
}

// This consumer thread's place in its warpgroup's 64 x 256 accumulator tile: rows Row() and
// Row() + 8, columns Column() + 8 i and + 1 (registers 4 i .. 4 i + 3).
struct FragmentPosition {
  int warp;  // within the warpgroup
  int lane;

  __device__ FragmentPosition()
      : warp(static_cast<int>(threadIdx.x) / 32 % 4), lane(static_cast<int>(threadIdx.x) % 32) {}
  __device__ int Row() const { return 16 * warp + lane / 4; }
  __device__ int Column() const { return 2 * (lane % 4); }
};

// ---------------------------------------------------------------- forward: cluster tiles

// `tile` in registers the compiler knows to be warp-uniform (see WarpUniform); one overload per
// tile kind.
__device__ __forceinline__ ClusterTile UniformTile(const ClusterTile& tile) {
  return {WarpUniform(tile.group), WarpUniform(tile.row0), WarpUniform(tile.row_end),
          WarpUniform(tile.n0), WarpUniform(tile.row_pair)};
}

// Fills `offsets` (groups + 1) from device memory and tile_prefix from them; the whole CTA calls
// it. Traps unless 0 = offsets[0] <= ... <= offsets[groups] = rows.
__device__ __forceinline__ void BuildClusterTileSchedule(const int32_t* device_offsets, int groups,
                                                         int rows, int n_tiles, int* offsets,
                                                         int* tile_prefix) {
  for (int i = static_cast<int>(threadIdx.x); i <= groups; i += kThreads) {
    offsets[i] = device_offsets[i];
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    int carry = 0;
    for (int first = 0; first < groups; first += 32) {
      const int g = first + lane;
      int count = 0;
      if (g < groups) {
        if (offsets[g] > offsets[g + 1]) __trap();
        count = ClusterTiles(offsets[g + 1] - offsets[g], n_tiles);
      }
      int inclusive = count;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += v;
      }
      if (g < groups) tile_prefix[g + 1] = carry + inclusive;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) {
      if (offsets[0] != 0 || offsets[groups] != rows) __trap();
      tile_prefix[0] = 0;
    }
  }
  __syncthreads();
}

// The TMA loads of one forward stage into this CTA (or, with mask != 0, into every CTA of the
// cluster in the mask, at the same shared offsets): rows of x as 64-row boxes, columns of w in
// kBlockN / 2-column halves. Half h of the tile at `column` is w's columns column + kBlockN / 2 h;
// with kSwiglu the tile's columns count double (see GroupedMatmulKernel): half 0 is the gate
// columns from column / 2, half 1 their up columns, f further.
template <bool kTransposeW, bool kSwiglu>
struct ForwardLoads {
  const CUtensorMap& x_map;
  const CUtensorMap& w_map;
  uint32_t full;  // the stage's full barrier
  int k0;         // the stage's first K index
  int f;          // kSwiglu: the gate (and up) columns of w

  // x rows [row, row + 64) into `a`.
  __device__ void XBox(uint32_t a, uint16_t mask, int row) const {
    if (mask != 0) {
      TmaLoad2dMulticast(x_map, a, full, mask, k0, row, L2EvictNormal());
    } else {
      TmaLoad2d(x_map, a, full, k0, row, L2EvictNormal());
    }
  }

  // Half `half` of the tile at `column` of `group`'s w into `b` (128 K-major rows, or 2 MN-major
  // 64 x 64 boxes).
  __device__ void WHalf(uint32_t b, uint16_t mask, int column, int half, int group) const {
    const int first = kSwiglu ? column / 2 + half * f : column + kBlockN / 2 * half;
    if constexpr (kTransposeW) {
      Box3d(b, mask, k0, first, group);
    } else {
#pragma unroll
      for (int box = 0; box < kBlockN / 2 / 64; ++box) {
        Box3d(b + box * kBoxBytes, mask, first + 64 * box, k0, group);
      }
    }
  }

 private:
  __device__ void Box3d(uint32_t dst, uint16_t mask, int c0, int c1, int c2) const {
    if (mask != 0) {
      TmaLoad3dMulticast(w_map, dst, full, mask, c0, c1, c2, L2EvictLast());
    } else {
      TmaLoad3d(w_map, dst, full, c0, c1, c2, L2EvictLast());
    }
  }
};

// ---------------------------------------------------------------- weight gradient: tiles

__device__ __forceinline__ WeightGradClusterTile UniformTile(const WeightGradClusterTile& tile) {
  return {WarpUniform(tile.group), WarpUniform(tile.m0), WarpUniform(tile.n0)};
}

// Part p's token rows of `group`, [begin, end). Traps on offsets outside 0 <= offsets[g] <=
// offsets[g + 1] <= rows.
struct RowRange {
  int begin, end;
};
__device__ __forceinline__ RowRange PartRows(const WeightGradParts& parts, int p, int group) {
  const int32_t* offsets = parts.offsets[p];
  const int begin = offsets[group], end = offsets[group + 1];
  if (begin < 0 || begin > end || end > parts.rows[p]) __trap();
  return {begin, end};
}

// The rows of a stage holding `valid` K rows that the consumers read: its slices with rows.
__device__ __forceinline__ int ReadRows(int valid) {
  return (valid + kWgmmaK - 1) / kWgmmaK * kWgmmaK;
}

// The 16-deep K slices with rows in each stage of a weight-gradient tile of `group`, called once
// per stage in order (MultiplyStages' stage_slices): every part's stages are whole but its last,
// which ends with the part's rows; the consumers skip the slices after that.
struct PartSlices {
  const WeightGradParts& parts;
  int group;
  int part = -1;
  int rows_left = 0;  // in `part`, from the next stage on

  __device__ int operator()() {
    while (rows_left == 0) {
      ++part;
      const RowRange range = PartRows(parts, part, group);
      rows_left = range.end - range.begin;
    }
    const int rows = min(kBlockK, rows_left);
    rows_left -= rows;
    return WarpUniform(ReadRows(rows) / kWgmmaK);
  }
};

// Zeroes the 128-byte lines of rows [valid, ReadRows(valid)) of the stage's six 64-row boxes (A:
// 2, B: 4): the K rows past the group's end that the consumers read (the slices after them they
// skip); the producer warp calls it (all lanes).
__device__ __forceinline__ void ZeroRowsPastEnd(uint8_t* a, uint8_t* b, int valid) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int line = valid + lane / 8; line < ReadRows(valid); line += 4) {
    const int offset = line * kSwizzleRowBytes + lane % 8 * 16;
#pragma unroll
    for (int box = 0; box < kBlockM / 64; ++box) {
      *reinterpret_cast<uint4*>(a + box * kBoxBytes + offset) = zero;
    }
#pragma unroll
    for (int box = 0; box < kBlockN / 64; ++box) {
      *reinterpret_cast<uint4*>(b + box * kBoxBytes + offset) = zero;
    }
  }
}

// Two adjacent dw elements at shared `address` = a, b (bf16: rounded to nearest even). Through
// 32-bit shared addresses: the compiler hoists WriteTile's store addresses out of the tile loop,
// and as 64-bit generic addresses the bf16 instantiation's 16 of them spilled.
template <typename Out>
__device__ __forceinline__ void StorePair(uint32_t address, float a, float b) {
  if constexpr (std::is_same_v<Out, float>) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(a), "f"(b) : "memory");
  } else {
    static_assert(std::is_same_v<Out, bf16>, "dw is f32 or bf16");
    // cvt puts its first source in the upper half: b, so that a lands at `address`.
    asm volatile(
        "{ .reg .b32 pair; cvt.rn.bf16x2.f32 pair, %2, %1;"
        " st.shared.b32 [%0], pair; }" ::"r"(address),
        "f"(a), "f"(b)
        : "memory");
  }
}

// Accumulator columns [kColumns round, kColumns (round + 1)) of this warpgroup's 64 x kBlockN
// result as Out into `staging` (shared address), as TMA boxes of 64 rows x kWriteColumns<Out>.
template <typename Out, int kColumns>
__device__ __forceinline__ void StageColumns(const Accumulators& acc, uint32_t staging, int round) {
  constexpr int kBoxColumns = kWriteColumns<Out>;
  const FragmentPosition at;
  const int row = at.Row();
  // Row r's 16-byte chunk c lies at chunk c ^ (r % 8); Row() % 8 = lane / 4, also for Row() + 8.
  const int swizzle = at.lane / 4;
#pragma unroll
  for (int j = 0; j < kColumns / 8; ++j) {
    const int i = round * (kColumns / 8) + j;  // accumulator column block
    const int column = 8 * j + at.Column();    // in the round
    const int byte = column % kBoxColumns * static_cast<int>(sizeof(Out));  // in the box row
    const uint32_t first = staging + column / kBoxColumns * kBoxBytes + row * kSwizzleRowBytes +
                           ((byte / 16) ^ swizzle) * 16 + byte % 16;
    StorePair<Out>(first, acc[4 * i], acc[4 * i + 1]);
    StorePair<Out>(first + 8 * kSwizzleRowBytes, acc[4 * i + 2], acc[4 * i + 3]);
  }
}

// Before this warpgroup refills its staging: its thread 0 waits until the writes it issued have
// read the staging (named barrier `barrier_id`).
__device__ __forceinline__ void AwaitStaging(int barrier_id) {
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitGroupRead<0>();
  NamedBarrierSync(barrier_id, kWarpgroupThreads);
}

// The columns of Out that kStagingBytes of staging hold: a round of StageRounds.
template <typename Out, int kStagingBytes>
constexpr int kStagedColumns = (kStagingBytes / kBoxBytes) * kWriteColumns<Out>;

// This warpgroup's 64 x kBlockN accumulators as Out, staged through its kStagingBytes of `staging`
// (shared address) in rounds of kStagedColumns<Out, kStagingBytes> columns: each round waits
// until the staging is free (AwaitStaging), stages its columns and calls written(round), which
// writes them out.
template <typename Out, int kStagingBytes, typename Written>
__device__ __forceinline__ void StageRounds(const Accumulators& acc, uint32_t staging,
                                            int barrier_id, Written written) {
  constexpr int kRoundColumns = kStagedColumns<Out, kStagingBytes>;
  static_assert(kBlockN % kRoundColumns == 0);
#pragma unroll
  for (int round = 0; round < kBlockN / kRoundColumns; ++round) {
    AwaitStaging(barrier_id);  // also: every thread is done with the previous round
    StageColumns<Out, kRoundColumns>(acc, staging, round);
    written(round);
  }
}

// The tensor-map coordinates (innermost first) of an output box.
struct BoxOrigin {
  int c0, c1, c2;
};

// This warpgroup's 64 x kBlockN accumulators as Out written (or added with `accumulate`: TMA
// reduce-add) to out_map, the box of tile columns [c, c + kWriteColumns<Out>) at box_at(c) (a
// BoxOrigin), staged in rounds through its kStagingBytes of `staging` (shared address); TMA clips
// the boxes to the tensor. Thread 0 issues the writes.
template <typename Out, int kStagingBytes, typename BoxAt>
__device__ __forceinline__ void WriteTile(const Accumulators& acc, const CUtensorMap& out_map,
                                          uint32_t staging, int barrier_id, bool accumulate,
                                          BoxAt box_at) {
  constexpr int kBoxes = kStagingBytes / kBoxBytes;  // per round
  constexpr int kRoundColumns = kStagedColumns<Out, kStagingBytes>;
  StageRounds<Out, kStagingBytes>(acc, staging, barrier_id, [&](int round) {
    FenceProxyAsync();
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
    if (threadIdx.x % kWarpgroupThreads == 0) {
#pragma unroll
      for (int box = 0; box < kBoxes; ++box) {
        const BoxOrigin at = box_at(round * kRoundColumns + box * kWriteColumns<Out>);
        TmaWrite3d(accumulate, out_map, staging + box * kBoxBytes, at.c0, at.c1, at.c2,
                   L2EvictFirst());
      }
      BulkCommitGroup();
    }
  });
}

// The byte offset in a staged bf16 tile (StageColumns) of row `row`'s 16-byte piece `piece` (its
// columns 8 piece .. 8 piece + 7): box piece / 8, chunk piece % 8 of the row, swizzled.
__device__ __forceinline__ int StagedPieceOffset(int row, int piece) {
  constexpr int kPiecesPerBoxRow = kSwizzleRowBytes / 16;
  return piece / kPiecesPerBoxRow * kBoxBytes + row * kSwizzleRowBytes +
         ((piece % kPiecesPerBoxRow) ^ (row % 8)) * 16;
}

// This warpgroup's accumulators as bf16, rows r < valid_rows (< 64: a group's last rows, which
// the next group's follow, where TMA would write all 64): the 8 columns from tile column c of row
// r to piece_at(r, c) (a bf16 pointer, or nullptr: past the tensor's columns), staged through
// `staging` (kStagingBytes: in rounds of as many columns as it holds) and copied in 16-byte pieces.
template <int kStagingBytes, typename PieceAt>
__device__ __forceinline__ void WriteRows(const Accumulators& acc, const uint8_t* staging,
                                          int barrier_id, int valid_rows, PieceAt piece_at) {
  constexpr int kRoundColumns = kStagedColumns<bf16, kStagingBytes>;
  constexpr int kPiecesPerRow = kRoundColumns / 8;
  StageRounds<bf16, kStagingBytes>(acc, SmemAddress(staging), barrier_id, [&](int round) {
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
    for (int piece = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
         piece < valid_rows * kPiecesPerRow; piece += kWarpgroupThreads) {
      const int r = piece / kPiecesPerRow, c = piece % kPiecesPerRow;
      bf16* const out = piece_at(r, round * kRoundColumns + 8 * c);
      if (out == nullptr) continue;
      *reinterpret_cast<uint4*>(out) =
          *reinterpret_cast<const uint4*>(staging + StagedPieceOffset(r, c));
    }
  });
}

// ---------------------------------------------------------------- forward: SwiGLU and its gradient

// What the forward kernel does with each consumer's result (see GroupedMatmulKernel): store it
// (y), or also hand it, staged as bf16, to the producer warpgroup's idle warps 1-3, which compute
// SwiGLU from it (fc1) or the SwiGLU gradient (fc2's data gradient) while the consumers go on
// with the next tile.
enum class Epilogue { kStore, kSwiglu, kSwigluBackward };
constexpr int kActivationWarps = 3;
constexpr int kActivationThreads = kActivationWarps * 32;

// The SwiGLU epilogues' operands (see the launchers): scale (rows) f32 or nullptr for 1; kSwiglu
// writes act (rows, f); kSwigluBackward reads h (rows, 2 f) and writes dh (rows, 2 f) and, unless
// nullptr, dscale_partials (column tiles, rows).
struct SwigluOperands {
  const float* scale;
  bf16* act;
  const bf16* h;
  bf16* dh;
  float* dscale_partials;
};

// The producer warpgroup's registers per epilogue, and the consumers' beside them: at 48,
// kSwiglu's activation warps spilled; kSwigluBackward's need room for kGradientRowsInFlight rows
// (at 104, ptxas still spills 16 bytes; 2 rows fit in 88 without).
__host__ __device__ constexpr int ProducerRegisters(Epilogue epilogue) {
  return epilogue == Epilogue::kStore ? kProducerRegisters
                                      : (epilogue == Epilogue::kSwiglu ? 56 : 104);
}
__host__ __device__ constexpr int ConsumerRegisters(Epilogue epilogue) {
  return epilogue == Epilogue::kStore ? kConsumerRegisters
                                      : (epilogue == Epilogue::kSwiglu ? 224 : 200);
}
constexpr bool RegistersFit(Epilogue epilogue) {
  return ProducerRegisters(epilogue) * kWarpgroupThreads +
             ConsumerRegisters(epilogue) * kWarpgroupThreads * kConsumers <=
         kLaunchRegisters * kThreads;
}
static_assert(RegistersFit(Epilogue::kSwiglu) && RegistersFit(Epilogue::kSwigluBackward));

// The hand-over of consumer c's staged tile: staged[c] (each consumer thread arrives once it has
// staged its part) and read[c] (each activation thread arrives once it has read the staging; the
// consumer restages only after that).
struct ActivationBarriers {
  uint32_t base;  // shared address of staged[0]; read follows

  static constexpr int kBytes = 2 * kConsumers * 8;
  __device__ uint32_t Staged(int consumer) const { return base + 8 * consumer; }
  __device__ uint32_t Read(int consumer) const { return base + 8 * (kConsumers + consumer); }
  __device__ void Init() const {
    for (int c = 0; c < kConsumers; ++c) {
      MbarrierInit(Staged(c), kWarpgroupThreads);
      MbarrierInit(Read(c), kActivationThreads);
    }
  }
};

// act[first_row + r][gate + c] = silu(g) * up * scale[first_row + r] for r < valid_rows and gate
// + c < f, c < kBlockN / 2, from a staged y tile whose tile columns [0, kBlockN / 2) are gate
// columns and [kBlockN / 2, kBlockN) their up columns (bf16, as y holds them: bit-identical to the
// SwiGLU kernel on y); `thread` of kActivationThreads, in 16-byte pieces.
__device__ __forceinline__ void WriteActivation(const uint8_t* staging, int thread,
                                                const float* scale, bf16* act, int f, int first_row,
                                                int valid_rows, int gate) {
  constexpr int kPiecesPerRow = kBlockN / 2 / 8;
  constexpr int kUpOffset = kBlockN / 2 * 64 * static_cast<int>(sizeof(bf16));
  for (int piece = thread; piece < valid_rows * kPiecesPerRow; piece += kActivationThreads) {
    const int r = piece / kPiecesPerRow, c = piece % kPiecesPerRow;
    const int column = gate + 8 * c;
    if (column >= f) continue;  // f is a multiple of 8: a piece lies wholly inside or outside
    const int offset = StagedPieceOffset(r, c);
    const uint4 gate_piece = *reinterpret_cast<const uint4*>(staging + offset);
    const uint4 up_piece = *reinterpret_cast<const uint4*>(staging + kUpOffset + offset);
    const float s = scale != nullptr ? scale[first_row + r] : 1.0f;
    const bf16* g = reinterpret_cast<const bf16*>(&gate_piece);
    const bf16* u = reinterpret_cast<const bf16*>(&up_piece);
    uint4 out_piece;
    bf16* out = reinterpret_cast<bf16*>(&out_piece);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      out[j] = __float2bfloat16(SwigluValue(__bfloat162float(g[j]), __bfloat162float(u[j]), s));
    }
    *reinterpret_cast<uint4*>(act + static_cast<int64_t>(first_row + r) * f + column) = out_piece;
  }
}

// The sum over a warp's lanes (the same order in every lane).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, lane_mask);
  }
  return v;
}

// Rows each activation warp has in flight in WriteSwigluGradients: their loads are issued
// together, so their latencies overlap. The fused kernel in the probe (random routing, 4096
// tokens; ms at Qwen3-30B-A3B / Mixtral / DeepSeek-V3-like, one H200, 2026-12-02): 2 rows 0.365 /
// 1.594 / 2.395, 3 rows 0.340 / 1.509 / 2.402, 4 rows 0.335 / 1.506 / 2.392; its GEMM alone
// 0.216 / 1.34-1.46 / 2.22-2.25. One row was slower than two by 0.06 / 0.24 / 0.07 ms (H100).
constexpr int kGradientRowsInFlight = 4;

// The SwiGLU gradient from a staged da tile (bf16, as a stored da would hold it: dh bit-identical
// to the SwiGLU backward kernel on it): for r < valid_rows and column + c < f, c < kBlockN, with
// row = first_row + r, gate g = h[row][column + c], up u = h[row][f + column + c] and d the staged
// da, dh[row][column + c] = dgate, dh[row][f + column + c] = dup (SwigluGradients), and
// dscale_partials[column / kBlockN][row] = the row's sum of their products (warp sum of each lane's
// 8 in order). Warp `warp` of kActivationWarps takes every third row, kGradientRowsInFlight at a
// time; lane l the 8 columns from 8 l, in 16-byte pieces.
__device__ __forceinline__ void WriteSwigluGradients(const uint8_t* staging, int warp,
                                                     const SwigluOperands& operands, int rows,
                                                     int f, int first_row, int valid_rows,
                                                     int column) {
  constexpr int kStep = kActivationWarps * kGradientRowsInFlight;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int c = column + 8 * lane;
  const bool inside = c < f;  // f is a multiple of 8: a piece lies wholly inside or outside
  const bf16* __restrict__ h = operands.h;
  bf16* __restrict__ dh = operands.dh;
  for (int first = warp; first < valid_rows; first += kStep) {
    uint4 gate_piece[kGradientRowsInFlight], up_piece[kGradientRowsInFlight];
    float s[kGradientRowsInFlight];
#pragma unroll
    for (int i = 0; i < kGradientRowsInFlight; ++i) {
      const int r = first + kActivationWarps * i;
      if (r >= valid_rows || !inside) continue;
      const int64_t gate_at = (first_row + r) * int64_t{2} * f + c;
      gate_piece[i] = *reinterpret_cast<const uint4*>(h + gate_at);
      up_piece[i] = *reinterpret_cast<const uint4*>(h + gate_at + f);
      s[i] = operands.scale != nullptr ? operands.scale[first_row + r] : 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kGradientRowsInFlight; ++i) {
      const int r = first + kActivationWarps * i;
      if (r >= valid_rows) break;  // warp-uniform
      const int64_t row = first_row + r;
      float product = 0.0f;
      if (inside) {
        const uint4 d_piece = *reinterpret_cast<const uint4*>(staging + StagedPieceOffset(r, lane));
        const bf16* d = reinterpret_cast<const bf16*>(&d_piece);
        const bf16* g = reinterpret_cast<const bf16*>(&gate_piece[i]);
        const bf16* u = reinterpret_cast<const bf16*>(&up_piece[i]);
        uint4 dgate_piece, dup_piece;
        bf16* dgate = reinterpret_cast<bf16*>(&dgate_piece);
        bf16* dup = reinterpret_cast<bf16*>(&dup_piece);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const SwigluGradient gradient = SwigluGradients(
              __bfloat162float(g[j]), __bfloat162float(u[j]), s[i], __bfloat162float(d[j]));
          dgate[j] = __float2bfloat16(gradient.gate);
          dup[j] = __float2bfloat16(gradient.up);
          product += gradient.product;
        }
        const int64_t gate_at = row * 2 * f + c;
        *reinterpret_cast<uint4*>(dh + gate_at) = dgate_piece;
        *reinterpret_cast<uint4*>(dh + gate_at + f) = dup_piece;
      }
      if (operands.dscale_partials != nullptr) {
        product = WarpSum(product);
        if (lane == 0) {
          operands.dscale_partials[static_cast<int64_t>(column / kBlockN) * rows + row] = product;
        }
      }
    }
  }
}

// Brings into L2 the gate and up values WriteSwigluGradients will read for rows [first_row,
// first_row + valid_rows) and columns [column, column + kBlockN) of h (rows, 2 f); `thread` of
// kActivationThreads.
__device__ __forceinline__ void PrefetchGateUp(const bf16* h, int f, int first_row, int valid_rows,
                                               int column, int thread) {
  constexpr int kLine = 128;
  const int bytes = (min(column + kBlockN, f) - column) * static_cast<int>(sizeof(bf16));
  if (bytes <= 0) return;
  for (int span = thread; span < 2 * valid_rows; span += kActivationThreads) {
    const int64_t row = first_row + span / 2;
    const char* first = reinterpret_cast<const char*>(h + row * 2 * f + span % 2 * f + column);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(first) / kLine * kLine;
    for (uintptr_t line = begin; line < reinterpret_cast<uintptr_t>(first) + bytes; line += kLine) {
      PrefetchL2(reinterpret_cast<const void*>(line));
    }
  }
}

// A consumer's part of a forward cluster tile: its rows [first_row, first_row + valid_rows) and
// columns from `column`; inactive (no wgmma, no output) when its rows lie past the group's end or
// its columns past n.
struct ConsumerTile {
  int first_row, column, valid_rows;
  bool active;

  __device__ ConsumerTile(const ClusterTile& tile, int rank, int consumer, int n)
      : first_row(tile.Row(rank) + 64 * consumer),
        column(tile.Column(rank)),
        valid_rows(min(64, tile.row_end - first_row)),
        active(first_row < tile.row_end && column < n) {}
};

// ---------------------------------------------------------------- forward: split tiles

// This consumer warpgroup's part (CTA rank, consumer) of a split slot.
__device__ __forceinline__ int SplitPart(int slot, int rank, int consumer) {
  return (slot * kForwardCluster + rank) * kConsumers + consumer;
}

// A writer piece's accumulators to its slot, then its flag (release); the warpgroup calls it.
__device__ __forceinline__ void StorePartial(const Accumulators& acc, const SplitWorkspace& split,
                                             int slot, int rank, int consumer, int barrier_id) {
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int part = SplitPart(slot, rank, consumer);
  float* const out = split.partials + int64_t{part} * kSplitPartFloats + thread;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) __stcg(out + i * kWarpgroupThreads, acc[i]);
  NamedBarrierSync(barrier_id, kWarpgroupThreads);  // every thread's stores before the flag
  if (thread == 0) {
    __threadfence();
    StoreRelease(split.flags + part, 1);
  }
}

// Piece 0's accumulators += the partials of the pieces - 1 writer slots from first_slot, in slot
// order (each waited for by its flag, which it clears); the warpgroup calls it.
__device__ __forceinline__ void AddPartials(Accumulators& acc, const SplitWorkspace& split,
                                            int first_slot, int pieces, int rank, int consumer,
                                            int barrier_id) {
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  for (int slot = first_slot; slot < first_slot + pieces - 1; ++slot) {
    const int part = SplitPart(slot, rank, consumer);
    if (thread == 0) TakeFlagAcquire(split.flags + part);
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
    const float* const in = split.partials + int64_t{part} * kSplitPartFloats + thread;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] += __ldcg(in + i * kWarpgroupThreads);
  }
}

// `unit` in registers the compiler knows to be warp-uniform.
__device__ __forceinline__ TileUnit UniformUnit(const TileUnit& unit) {
  return {WarpUniform(unit.tile),  WarpUniform(unit.piece), WarpUniform(unit.k_begin),
          WarpUniform(unit.k_end), WarpUniform(unit.slot),  WarpUniform(unit.pieces)};
}

// ---------------------------------------------------------------- kernels

// The forward kernel's shared memory: kStages operand stages and each consumer's output staging,
// beside the offsets and the hand-over barriers. A plain product with transpose_w (fc2's forward)
// gets 4 stages and one box of staging (its result written in 4 rounds); the others keep 3 stages
// beside a staging that holds the whole result (the hand-over epilogues need it). In the probe
// (random routing, 4096 tokens, one H200, 2026-12-03; ms, 3 vs 4 stages): fc2's forward 0.222 ->
// 0.210 at Qwen3-30B-A3B, 1.391-1.425 -> 1.364 at Mixtral-8x7B, 2.477-2.504 -> 2.275 at
// DeepSeek-V3-like. Without transpose_w (the data gradients) 4 stages helped fc1's at Qwen3 (0.398
// -> 0.376) but slowed fc2's (0.267 -> 0.276 at Qwen3, 2.33 -> 2.51 at DeepSeek-V3-like), so that
// kernel keeps 3.
template <bool kTransposeW, Epilogue kEpilogue>
struct ForwardPipeline {
  static constexpr bool kFourStages = kTransposeW && kEpilogue == Epilogue::kStore;
  static constexpr int kStages = kFourStages ? 4 : kForwardStages;
  static constexpr int kStagingBytes = kFourStages ? kBoxBytes : kForwardStagingBytes;
  static constexpr int kSmemBytes = StageRing<kStages>::kBytesBeforeExtra +
                                    kConsumers * kStagingBytes + 2 * (kMaxGroups + 1) * 4 +
                                    ActivationBarriers::kBytes;
  static_assert(kSmemBytes <= 227 * 1024);
};

// y = x · op(w) per group (see the file comment), in clusters of kForwardCluster CTAs. x_map: x
// as (k, rows), box (64, 64); w_map: w as (k, n, groups), box (64, 128, 1) when kTransposeW,
// else (n, k, groups), box (64, 64, 1); y_map: y as (n, rows, 1), box (64, 64, 1). split: the
// last wave's workspace (TailSplit; Epilogue::kStore only).
// Epilogue::kSwiglu (fc1 with SwiGLU: w's n = 2 f rows are [gate | up]; kTransposeW): also
// swiglu.act = silu(gate) * up * scale[row] (rows, f). A tile then holds 128 gate columns and their
// 128 up columns (the schedule's column c is gate column c / 2); y_map is y as (f, 2, rows) (the
// gate or up half as a dimension, clipped at f), box (64, 1, 64). Each consumer stages and writes
// y as usual and hands the staging to the activation warps (ActivationBarriers), which compute a
// from it (WriteActivation) during the consumer's next mainloop. (Computing a in the consumers'
// epilogue, staged and TMA-written after y, made fc1 0.04-0.38 ms slower instead of saving the
// SwiGLU kernel's 0.05-0.18 ms: probe, H200, 2026-12-02.)
// Epilogue::kSwigluBackward (fc2's data gradient, y = da (rows, n = f); not kTransposeW): y is not
// written (y_map unused); each consumer only stages its da tile as bf16 and hands it over, and the
// activation warps write swiglu.dh and the dscale partials from it (WriteSwigluGradients), having
// asked for the tile's gate and up values in L2 (PrefetchGateUp) before waiting for it.
template <bool kTransposeW, Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedMatmulKernel(const __grid_constant__ CUtensorMap x_map,
                        const __grid_constant__ CUtensorMap w_map,
                        const __grid_constant__ CUtensorMap y_map, const int32_t* device_offsets,
                        int groups, int rows, int n, int k, bf16* y, SwigluOperands swiglu,
                        SplitWorkspace split) {
#if MOE_SM90A_KERNELS
  static_assert(kForwardCluster == 2, "a cluster tile is a pair of tiles");
  using Pipeline = ForwardPipeline<kTransposeW, kEpilogue>;
  constexpr int kStages = Pipeline::kStages;
  constexpr int kStagingBytes = Pipeline::kStagingBytes;
  extern __shared__ uint8_t smem_raw[];
  const StageRing<kStages> ring(smem_raw);
  const auto barriers = ring.template Barriers<kForwardCluster>();
  int* const offsets = reinterpret_cast<int*>(ring.Extra() + kConsumers * kStagingBytes);
  int* const tile_prefix = offsets + kMaxGroups + 1;
  const ActivationBarriers activation{SmemAddress(tile_prefix + kMaxGroups + 1)};
  constexpr bool kSwiglu = kEpilogue == Epilogue::kSwiglu;
  constexpr bool kHandOver = kEpilogue != Epilogue::kStore;  // the activation warps take part
  if (threadIdx.x == 0) {
    if (kHandOver) activation.Init();
    barriers.Init();  // its fence also covers the activation barriers
  }
  static_assert(kTransposeW || !kSwiglu, "SwiGLU follows fc1, whose w is (groups, 2 f, k)");
  static_assert(!kTransposeW || kEpilogue != Epilogue::kSwigluBackward,
                "the SwiGLU gradient follows fc2's data gradient, whose w is (groups, k, f)");
  const int f = kSwiglu ? n / 2 : n;  // the SwiGLU's columns (kSwigluBackward: da's)
  const int n_tiles = kSwiglu ? (f + kBlockN / 2 - 1) / (kBlockN / 2) : (n + kBlockN - 1) / kBlockN;
  BuildClusterTileSchedule(device_offsets, groups, rows, n_tiles, offsets, tile_prefix);
  ClusterSync();  // every CTA's barriers are initialised before any multicast reaches them
  const ClusterTileSchedule schedule{offsets, tile_prefix, groups, n_tiles};
  const int k_blocks = (k + kBlockK - 1) / kBlockK;
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  const int rank = ClusterRank();
  const int first_unit = ClusterIndex(), unit_step = ClusterCount();
  // Only the plain products split their tail. The hand-over kernels keep every tile whole: with
  // the split (their activation warps at their register limit) the SwiGLU gradient's was 1-4%
  // slower at every shape and fc1 + SwiGLU 1% slower at Qwen3-30B-A3B, where nothing split
  // (probe, H200, 2026-12-04).
  constexpr bool kSplitsTail = kEpilogue == Epilogue::kStore;
  static_assert(!(kSplitsTail && kHandOver));
  const int total = WarpUniform(schedule.Total());
  const TailSplit plan = kSplitsTail ? TailSplit::Of(total, unit_step, k_blocks, split.slots)
                                     : TailSplit::Whole(total, k_blocks);
  const int units = WarpUniform(plan.Units());

  if (warpgroup == 0) {
    DecreaseMaxRegisters<ProducerRegisters(kEpilogue)>();
    if (threadIdx.x == 0) {
      PrefetchTensorMap(x_map);
      PrefetchTensorMap(w_map);
      constexpr uint16_t kBoth = (1u << kForwardCluster) - 1;
      PipelineState<kStages> state;
      for (int u = first_unit; u < units; u += unit_step) {
        const TileUnit unit = plan.Find(u);
        const ClusterTile tile = schedule.Find(unit.tile);
        // x's second box of this CTA's tile is loaded only where it holds rows of the group (a
        // short last row tile's lie past it; its consumer idles).
        const bool second_box = tile.Row(rank) + 64 < tile.row_end;
        for (int kb = unit.k_begin; kb < unit.k_end; ++kb) {
          MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
          const uint32_t full = barriers.Full(state.stage);
          // Every CTA's stage receives its own loads and its peer's multicast: w's tile and x's
          // boxes.
          MbarrierArriveExpectTx(full, kStageBBytes + (second_box ? 2 : 1) * kBoxBytes);
          const ForwardLoads<kTransposeW, kSwiglu> load{x_map, w_map, full, kb * kBlockK, f};
          const uint32_t a = ring.A(state.stage), b = ring.B(state.stage);
          if (tile.row_pair) {  // own rows of x; half `rank` of the shared w columns to both
            load.XBox(a, 0, tile.Row(rank));
            if (second_box) load.XBox(a + kBoxBytes, 0, tile.Row(rank) + 64);
            load.WHalf(b + rank * (kStageBBytes / 2), kBoth, tile.n0, rank, tile.group);
          } else {  // 64-row half `rank` of the shared x rows to both; own w columns
            if (rank == 0 || second_box) {
              load.XBox(a + rank * kBoxBytes, kBoth, tile.row0 + 64 * rank);
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              load.WHalf(b + half * (kStageBBytes / 2), 0, tile.Column(rank), half, tile.group);
            }
          }
          state.Advance();
        }
      }
    } else if (kHandOver && threadIdx.x >= kWarpgroupThreads - kActivationThreads) {
      const int thread = static_cast<int>(threadIdx.x) - (kWarpgroupThreads - kActivationThreads);
      uint32_t staged_phases = 0;  // bit c: parity of staged[c]'s next phase
      for (int t = first_unit; t < units; t += unit_step) {  // no split: unit t is tile t
        const ClusterTile tile = UniformTile(schedule.Find(t));
        if constexpr (!kSwiglu) {
#pragma unroll 1
          for (int consumer = 0; consumer < kConsumers; ++consumer) {
            const ConsumerTile part(tile, rank, consumer, n);
            if (part.active) {
              PrefetchGateUp(swiglu.h, f, part.first_row, part.valid_rows, part.column, thread);
            }
          }
        }
#pragma unroll 1
        for (int consumer = 0; consumer < kConsumers; ++consumer) {
          const ConsumerTile part(tile, rank, consumer, n);
          if (!part.active) continue;
          MbarrierWait(activation.Staged(consumer), (staged_phases >> consumer) & 1);
          staged_phases ^= 1u << consumer;
          const uint8_t* const staged = ring.Extra() + consumer * kStagingBytes;
          if constexpr (kSwiglu) {
            WriteActivation(staged, thread, swiglu.scale, swiglu.act, f, part.first_row,
                            part.valid_rows, part.column / 2);
          } else {
            WriteSwigluGradients(staged, thread / 32, swiglu, rows, f, part.first_row,
                                 part.valid_rows, part.column);
          }
          MbarrierArrive(activation.Read(consumer));
        }
      }
    }
  } else {
    IncreaseMaxRegisters<ConsumerRegisters(kEpilogue)>();
    const int consumer = warpgroup - 1;
    uint8_t* const staging_generic = ring.Extra() + consumer * kStagingBytes;
    const uint32_t staging = SmemAddress(staging_generic);
    Accumulators acc;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    PipelineState<kStages> state;
    uint32_t read_phase = 0;
    bool read_pending = false;  // kHandOver: the activation warps may still read the staging
    for (int u = first_unit; u < units; u += unit_step) {
      const TileUnit unit = UniformUnit(plan.Find(u));
      const ClusterTile tile = UniformTile(schedule.Find(unit.tile));
      const ConsumerTile part(tile, rank, consumer, n);
      const int first_row = part.first_row, column = part.column, valid_rows = part.valid_rows;
      const bool active = part.active;
      const auto a_descriptor = [&](int stage, int slice) {
        return KMajorDescriptor(ring.A(stage) + consumer * kBoxBytes, slice);
      };
      const auto b_descriptor = [&](int stage, int slice) {
        return kTransposeW ? KMajorDescriptor(ring.B(stage), slice)
                           : MNMajorDescriptor(ring.B(stage), slice);
      };
      MultiplyStages<0, kTransposeW ? 0 : 1>(acc, unit.k_end - unit.k_begin, active, barriers,
                                             state, a_descriptor, b_descriptor);
      if (!active) continue;
      const int barrier = 1 + consumer;
      if (unit.WritesPartial()) {
        StorePartial(acc, split, unit.slot, rank, consumer, barrier);
        continue;
      }
      if (unit.AddsPartials()) {
        AddPartials(acc, split, unit.slot, unit.pieces, rank, consumer, barrier);
      }
      if (read_pending) {
        MbarrierWait(activation.Read(consumer), read_phase);
        read_phase ^= 1;
      }
      if constexpr (kEpilogue == Epilogue::kStore) {
        if (valid_rows == 64) {
          WriteTile<bf16, kStagingBytes>(acc, y_map, staging, barrier, false, [&](int c) {
            return BoxOrigin{column + c, first_row, 0};
          });
        } else {
          WriteRows<kStagingBytes>(acc, staging_generic, barrier, valid_rows, [&](int r, int c) {
            const int64_t row = first_row + r;
            return column + c < n ? y + row * n + column + c : nullptr;
          });
        }
      } else if constexpr (kSwiglu) {
        // Tile columns [0, kHalf) are y's gate columns from `gate`, [kHalf, kBlockN) its up
        // columns.
        const int gate = column / 2;
        constexpr int kHalf = kBlockN / 2;
        if (valid_rows == 64) {
          WriteTile<bf16, kStagingBytes>(acc, y_map, staging, barrier, false, [&](int c) {
            return BoxOrigin{gate + c % kHalf, c / kHalf, first_row};
          });
        } else {
          WriteRows<kStagingBytes>(acc, staging_generic, barrier, valid_rows, [&](int r, int c) {
            const int64_t row = first_row + r;
            return gate + c % kHalf < f ? y + row * n + c / kHalf * f + gate + c % kHalf : nullptr;
          });
        }
      } else {  // kSwigluBackward: da is only staged, for the activation warps
        StageColumns<bf16, kBlockN>(acc, staging, 0);
      }
      if constexpr (kHandOver) {
        MbarrierArrive(activation.Staged(consumer));
        read_pending = true;
      }
    }
    if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
  }
  // No CTA leaves while its peer may still release a stage in it (remote mbarrier arrivals).
  __syncwarp();
  ClusterSync();
#else
  __trap();
#endif
}

// dw_g (+)= sum over the parts p of dy_p,g^T · x_p,g (see the file comment), in clusters of
// kWeightGradCluster CTAs sharing (multicasting) x's columns. The operands are MN-major (each
// token row is a K row); a tile's reduction runs over its group's rows in each part in turn.
// dw_map: dw (Out) as (k, n, groups), box (kWriteColumns<Out>, 64, 1); schedule: the cluster
// tiles of dw (grouped_gemm_tiles.h).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedWeightGradKernel(const __grid_constant__ WeightGradParts parts,
                            const __grid_constant__ CUtensorMap dw_map,
                            WeightGradClusterSchedule schedule, int groups, int n,
                            bool accumulate) {
#if MOE_SM90A_KERNELS
  static_assert(kWeightGradCluster == 2, "a cluster tile is a pair of tiles");
  extern __shared__ uint8_t smem_raw[];
  const StageRing<kWeightGradStages> ring(smem_raw);
  const auto barriers = ring.Barriers<kWeightGradCluster>();
  if (threadIdx.x == 0) barriers.Init();
  ClusterSync();  // every CTA's barriers are initialised before any multicast reaches them
  const int total = groups * schedule.PerGroup();
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  const int rank = ClusterRank();
  const int first_tile = ClusterIndex(), tile_step = ClusterCount();

  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x < 32) {  // the producer warp; its lanes mask the stages past a group's end
      const bool issuer = threadIdx.x == 0;
      if (issuer) {
        for (int p = 0; p < parts.count; ++p) {
          PrefetchTensorMap(parts.dy[p]);
          PrefetchTensorMap(parts.x[p]);
        }
      }
      constexpr uint16_t kBoth = (1u << kWeightGradCluster) - 1;
      constexpr int kXBoxes = kBlockN / 64 / kWeightGradCluster;  // x boxes this CTA loads
      PipelineState<kWeightGradStages> state;
      uint32_t landed_phases = 0;  // bit s: parity of landed[s]'s next phase
      static_assert(kWeightGradStages <= 32);
      for (int t = first_tile; t < total; t += tile_step) {
        const WeightGradClusterTile tile = schedule.Find(t);
        for (int p = 0; p < parts.count; ++p) {
          const CUtensorMap& dy_map = parts.dy[p];
          const CUtensorMap& x_map = parts.x[p];
          const RowRange range = PartRows(parts, p, tile.group);
          for (int row = range.begin; row < range.end; row += kBlockK) {
            MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
            const int valid = min(kBlockK, range.end - row);
            const bool masked = valid < ReadRows(valid);  // rows to zero before the consumers
            const uint32_t landing =
                masked ? barriers.Landed(state.stage) : barriers.Full(state.stage);
            if (issuer) {
              // Every CTA's stage receives kStageBytes: its own dy columns, its half of x's
              // columns and its peer's half.
              MbarrierArriveExpectTx(landing, kStageBytes);
#pragma unroll
              for (int box = 0; box < kBlockM / 64; ++box) {
                TmaLoad2d(dy_map, ring.A(state.stage) + box * kBoxBytes, landing,
                          tile.Row(rank) + 64 * box, row, L2EvictLast());
              }
#pragma unroll
              for (int i = 0; i < kXBoxes; ++i) {
                const int box = rank * kXBoxes + i;
                TmaLoad2dMulticast(x_map, ring.B(state.stage) + box * kBoxBytes, landing, kBoth,
                                   tile.n0 + 64 * box, row, L2EvictLast());
              }
            }
            if (masked) {  // every CTA of the cluster masks its own copy of the stage
              MbarrierWait(landing, (landed_phases >> state.stage) & 1);
              landed_phases ^= 1u << state.stage;
              ZeroRowsPastEnd(ring.APointer(state.stage), ring.BPointer(state.stage), valid);
              FenceProxyAsync();
              __syncwarp();
              if (issuer) MbarrierArrive(barriers.Full(state.stage));
            }
            state.Advance();
          }
        }
      }
    }
  } else {
    IncreaseMaxRegisters<kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const uint32_t staging = SmemAddress(ring.Extra() + consumer * kWeightGradStagingBytes);
    Accumulators acc;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    PipelineState<kWeightGradStages> state;
    for (int t = first_tile; t < total; t += tile_step) {
      const WeightGradClusterTile tile = UniformTile(schedule.Find(t));
      int k_blocks = 0;
      for (int p = 0; p < parts.count; ++p) {
        const RowRange range = PartRows(parts, p, tile.group);
        k_blocks += (range.end - range.begin + kBlockK - 1) / kBlockK;
      }
      k_blocks = WarpUniform(k_blocks);
      if (k_blocks == 0 && accumulate) continue;  // no rows: dw_g stays as it is
      const int row0 = tile.Row(rank) + 64 * consumer;
      const bool active = row0 < n;
      const auto a_descriptor = [&](int stage, int slice) {
        return MNMajorDescriptor(ring.A(stage) + consumer * kBoxBytes, slice);
      };
      const auto b_descriptor = [&](int stage, int slice) {
        return MNMajorDescriptor(ring.B(stage), slice);
      };
      MultiplyStages<1, 1>(acc, k_blocks, active, barriers, state, a_descriptor, b_descriptor,
                           PartSlices(parts, tile.group));
      if (!active) continue;
      if (k_blocks == 0) {  // no rows, and dw_g =: zeros (no wgmma cleared the accumulators)
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
      }
      WriteTile<Out, kWeightGradStagingBytes>(acc, dw_map, staging, 1 + consumer, accumulate,
                                              [&](int c) {
                                                return BoxOrigin{tile.n0 + c, row0, tile.group};
                                              });
    }
    if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
  }
  // No CTA leaves while its peer may still release a stage in it or multicast into it.
  __syncwarp();
  ClusterSync();
#else
  __trap();
#endif
}

// ---------------------------------------------------------------- host

constexpr int kWeightGradSmemBytes =
    StageRing<kWeightGradStages>::kBytesBeforeExtra + kConsumers * kWeightGradStagingBytes;
static_assert(kWeightGradSmemBytes <= 227 * 1024);

inline bool FitsInt(int64_t v) { return v >= 0 && v < (int64_t{1} << 31); }

// A launch of kernels of kThreads in clusters of `cluster_size` CTAs, with `smem_bytes` of dynamic
// shared memory, on `stream`: fills *config (pointing at *attribute), one cluster as its grid.
inline void ClusterLaunchConfig(int smem_bytes, int cluster_size, cudaStream_t stream,
                                cudaLaunchConfig_t* config, cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  config->gridDim = dim3(static_cast<unsigned>(cluster_size));
  config->blockDim = dim3(kThreads);
  config->dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config->stream = stream;
  config->attrs = attribute;
  config->numAttrs = 1;
}

// How many clusters of `kernel`, launched as ClusterLaunchConfig says, can be resident at once on
// the current device (*clusters); sets the kernel's dynamic shared-memory attribute.
inline cudaError_t ResidentClusters(const void* kernel, int smem_bytes, int cluster_size,
                                    int* clusters) {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute;
  ClusterLaunchConfig(smem_bytes, cluster_size, nullptr, &config, &attribute);
  const cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (status != cudaSuccess) return status;
  return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
}

// A persistent launch of kKernel in clusters of `cluster_size` CTAs: as many clusters as can be
// resident at once (none idle: at most `tiles`), with `smem_bytes` of dynamic shared memory.
// Fills *config (pointing at *attribute). The residency is asked (and the shared-memory attribute
// set) once per kernel and device.
template <auto kKernel>
cudaError_t PersistentClusterLaunch(int smem_bytes, int cluster_size, int64_t tiles,
                                    cudaStream_t stream, cudaLaunchConfig_t* config,
                                    cudaLaunchAttribute* attribute) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> resident_clusters[kMaxDevices] = {};  // 0: not asked yet
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device >= kMaxDevices) return cudaErrorInvalidValue;
  if (resident_clusters[device] == 0) {
    int clusters = 0;
    status = ResidentClusters(reinterpret_cast<const void*>(kKernel), smem_bytes, cluster_size,
                              &clusters);
    if (status != cudaSuccess) return status;
    if (clusters < 1) return cudaErrorInvalidValue;  // declined: no cluster fits
    resident_clusters[device] = clusters;
  }
  ClusterLaunchConfig(smem_bytes, cluster_size, stream, config, attribute);
  const int64_t clusters =
      std::max<int64_t>(1, std::min<int64_t>(resident_clusters[device], tiles));
  config->gridDim = dim3(static_cast<unsigned>(clusters * cluster_size));
  return cudaSuccess;
}

}  // namespace detail

namespace detail {

// Whether the forward kernel takes these arguments (see the file comment's requirements).
inline bool ForwardArgumentsValid(const bf16* x, const bf16* w, const bf16* y, int groups,
                                  int64_t rows, int64_t n, int64_t k) {
  return groups >= 1 && groups <= kMaxGroups && FitsInt(rows) && FitsInt(n) && FitsInt(k) &&
         n % 8 == 0 && k % 8 == 0 && Aligned16(x) && Aligned16(w) && Aligned16(y);
}

// The launch of GroupedMatmulSm90, GroupedMatmulSwigluSm90 (kSwiglu: y (rows, n = 2 f)) and
// GroupedMatmulSwigluBackwardSm90 (kSwigluBackward: y unused, n = f) on valid arguments with rows,
// n, k > 0.
template <bool kTransposeW, Epilogue kEpilogue>
cudaError_t LaunchGroupedMatmul(const bf16* x, const bf16* w, const int32_t* offsets, int groups,
                                int64_t rows, int64_t n, int64_t k, bf16* y,
                                const SwigluOperands& swiglu, const SplitWorkspace& split,
                                cudaStream_t stream) {
  CUtensorMap x_map, w_map, y_map = {};
  const uint64_t g = static_cast<uint64_t>(groups), ur = static_cast<uint64_t>(rows);
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k), uf = un / 2;
  cudaError_t status = EncodeTensorMap<2>(&x_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, {uk, ur},
                                          {uk * 2}, {kBlockK, 64});
  if (status != cudaSuccess) return status;
  status = kTransposeW
               ? EncodeTensorMap<3>(&w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, {uk, un, g},
                                    {uk * 2, un * uk * 2}, {kBlockK, kBlockN / 2, 1})
               : EncodeTensorMap<3>(&w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, {un, uk, g},
                                    {un * 2, un * uk * 2}, {64, kBlockK, 1});
  if (status != cudaSuccess) return status;
  constexpr uint32_t kColumns = kWriteColumns<bf16>;
  if constexpr (kEpilogue == Epilogue::kSwiglu) {
    status = EncodeTensorMap<3>(&y_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, y, {uf, 2, ur},
                                {uf * 2, un * 2}, {kColumns, 1, 64});
  } else if constexpr (kEpilogue == Epilogue::kStore) {
    status = EncodeTensorMap<3>(&y_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, y, {un, ur, 1},
                                {un * 2, un * 2 * ur}, {kColumns, 64, 1});
  }
  if (status != cudaSuccess) return status;
  // Cluster tiles <= row tiles x column tiles; sum_g ceil(rows_g / kBlockM) <= (rows + groups
  // (kBlockM - 1)) / kBlockM. (With kSwiglu, ceil(f / (kBlockN / 2)) column tiles: as many.)
  const int64_t tiles = (rows + static_cast<int64_t>(groups) * (kBlockM - 1)) / kBlockM *
                        ((n + kBlockN - 1) / kBlockN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  constexpr auto kKernel = &GroupedMatmulKernel<kTransposeW, kEpilogue>;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster;
  status = PersistentClusterLaunch<kKernel>(ForwardPipeline<kTransposeW, kEpilogue>::kSmemBytes,
                                            kForwardCluster, tiles, stream, &config, &cluster);
  if (status != cudaSuccess) return status;
  status = cudaLaunchKernelEx(&config, kKernel, x_map, w_map, y_map, offsets, groups,
                              static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k), y,
                              swiglu, split);
  return status != cudaSuccess ? status : cudaGetLastError();
}

// dscale[row] = sum over the tiles t, in order, of partials[t][row]; partials (tiles, rows).
__global__ void SumDscalePartialsKernel(const float* partials, int64_t tiles, int64_t rows,
                                        float* dscale) {
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t t = 0; t < tiles; ++t) sum += partials[t * rows + row];
    dscale[row] = sum;
  }
}

}  // namespace detail

// See the file comment. `split`: the workspace of a split last wave (SplitWorkspace; slots 0:
// every tile whole), used by one launch at a time. Asynchronous on `stream`; returns the first
// error of argument checks, tensor-map encoding or the launch.
inline cudaError_t GroupedMatmulSm90(const bf16* x, const bf16* w, const int32_t* offsets,
                                     int groups, int64_t rows, int64_t n, int64_t k,
                                     bool transpose_w, bf16* y, const SplitWorkspace& split,
                                     cudaStream_t stream) {
  using namespace detail;
  if (!ForwardArgumentsValid(x, w, y, groups, rows, n, k)) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  if (k == 0) return cudaMemsetAsync(y, 0, static_cast<size_t>(rows * n) * sizeof(bf16), stream);
  const SwigluOperands none = {};
  return transpose_w ? LaunchGroupedMatmul<true, Epilogue::kStore>(x, w, offsets, groups, rows, n,
                                                                   k, y, none, split, stream)
                     : LaunchGroupedMatmul<false, Epilogue::kStore>(x, w, offsets, groups, rows, n,
                                                                    k, y, none, split, stream);
}

// See the file comment: y = x · w_g^T per group as GroupedMatmulSm90 with transpose_w, w (groups,
// 2 f, k), and act (rows, f) = silu(gate) * up * scale[row] of y's [gate | up] halves as y holds
// them (bf16), bit-identical to a SwiGLU kernel of the same formula (swiglu_math.cuh) on y; scale
// (rows) f32, or nullptr for 1. Declines (cudaErrorInvalidValue: the caller runs the two steps)
// where GroupedMatmulSm90 would, where f is no multiple of 8 or act not 16-byte aligned, and
// where rows, f or k is 0.
inline cudaError_t GroupedMatmulSwigluSm90(const bf16* x, const bf16* w, const int32_t* offsets,
                                           int groups, int64_t rows, int64_t f, int64_t k,
                                           const float* scale, bf16* y, bf16* act,
                                           cudaStream_t stream) {
  using namespace detail;
  if (!ForwardArgumentsValid(x, w, y, groups, rows, 2 * f, k) || f % 8 != 0 || !Aligned16(act) ||
      rows == 0 || f == 0 || k == 0) {
    return cudaErrorInvalidValue;
  }
  const SwigluOperands swiglu = {scale, act, nullptr, nullptr, nullptr};
  return LaunchGroupedMatmul<true, Epilogue::kSwiglu>(x, w, offsets, groups, rows, 2 * f, k, y,
                                                      swiglu, SplitWorkspace{}, stream);
}

// The column tiles of the fc2 data gradient da (rows, f): the rows of
// GroupedMatmulSwigluBackwardSm90's dscale partials.
inline int64_t SwigluBackwardPartialTiles(int64_t f) { return (f + kBlockN - 1) / kBlockN; }

// See the file comment: da = dy · w_g per group as GroupedMatmulSm90 without transpose_w (dy
// (rows, k), w (groups, k, f)), never stored: from da rounded to bf16, dh (rows, 2 f) = [dgate |
// dup] of silu(gate) * up * scale[row] (swiglu_math.cuh's SwigluGradients, bit-identical to a
// SwiGLU backward kernel of the same formula on the rounded da) with gate and up from h (rows,
// 2 f); dscale (rows) f32 = sum_j silu(gate) * up * da, summed per 256-column tile into
// dscale_partials (SwigluBackwardPartialTiles(f), rows) f32 and then over the tiles in order.
// scale nullptr: 1; dscale nullptr: not computed (dscale_partials unused). Declines
// (cudaErrorInvalidValue) as GroupedMatmulSwigluSm90 does (also for h and dh not 16-byte aligned).
inline cudaError_t GroupedMatmulSwigluBackwardSm90(const bf16* dy, const bf16* w,
                                                   const int32_t* offsets, int groups, int64_t rows,
                                                   int64_t f, int64_t k, const float* scale,
                                                   const bf16* h, bf16* dh, float* dscale_partials,
                                                   float* dscale, cudaStream_t stream) {
  using namespace detail;
  if (!ForwardArgumentsValid(dy, w, h, groups, rows, f, k) || !FitsInt(2 * f) || f % 8 != 0 ||
      !Aligned16(dh) || (dscale != nullptr && dscale_partials == nullptr) || rows == 0 || f == 0 ||
      k == 0) {
    return cudaErrorInvalidValue;
  }
  const SwigluOperands swiglu = {scale, nullptr, h, dh,
                                 dscale != nullptr ? dscale_partials : nullptr};
  const cudaError_t status = LaunchGroupedMatmul<false, Epilogue::kSwigluBackward>(
      dy, w, offsets, groups, rows, f, k, nullptr, swiglu, SplitWorkspace{}, stream);
  if (status != cudaSuccess || dscale == nullptr) return status;
  constexpr int kSumThreads = 256;
  const int64_t blocks = std::min<int64_t>((rows + kSumThreads - 1) / kSumThreads, 4096);
  SumDscalePartialsKernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(
      dscale_partials, SwigluBackwardPartialTiles(f), rows, dscale);
  return cudaGetLastError();
}

// One part of a weight gradient's token rows: dy (rows, n) and x (rows, k) bf16, offsets (groups +
// 1) int32 in device memory.
struct WeightGradRows {
  const bf16* dy;
  const bf16* x;
  const int32_t* offsets;
  int64_t rows;
};

// dw_g (+)= sum over the `count` parts of dy_p,g^T x_p,g (see the file comment), in one launch:
// count <= kMaxWeightGradParts. Out (dw's element type) is float or bf16. Asynchronous on
// `stream`.
template <typename Out>
cudaError_t GroupedMatmulWeightGradSm90(const WeightGradRows* rows_parts, int count, int groups,
                                        int64_t n, int64_t k, bool accumulate, Out* dw,
                                        cudaStream_t stream) {
  using namespace detail;
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>, "dw is f32 or bf16");
  constexpr uint64_t kOutBytes = sizeof(Out);
  if (groups < 1 || count < 1 || count > kMaxWeightGradParts || !FitsInt(n) || !FitsInt(k) ||
      n % 8 != 0 || k % 8 != 0 || !Aligned16(dw)) {
    return cudaErrorInvalidValue;
  }
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k);
  WeightGradParts parts = {};
  int64_t rows = 0;  // of all parts
  for (int i = 0; i < count; ++i) {
    const WeightGradRows& part = rows_parts[i];
    if (!FitsInt(part.rows) || !Aligned16(part.dy) || !Aligned16(part.x)) {
      return cudaErrorInvalidValue;
    }
    if (part.rows == 0 || n == 0 || k == 0) continue;  // nothing to add (its offsets are all 0)
    const int p = parts.count++;
    const uint64_t ur = static_cast<uint64_t>(part.rows);
    cudaError_t status = EncodeTensorMap<2>(&parts.dy[p], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, part.dy,
                                            {un, ur}, {un * 2}, {64, kBlockK});
    if (status != cudaSuccess) return status;
    status = EncodeTensorMap<2>(&parts.x[p], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, part.x, {uk, ur},
                                {uk * 2}, {64, kBlockK});
    if (status != cudaSuccess) return status;
    parts.offsets[p] = part.offsets;
    parts.rows[p] = static_cast<int>(part.rows);
    rows += part.rows;
  }
  if (n == 0 || k == 0) return cudaSuccess;
  if (rows == 0) {
    return accumulate
               ? cudaSuccess
               : cudaMemsetAsync(dw, 0, static_cast<size_t>(groups * n * k) * kOutBytes, stream);
  }
  const WeightGradClusterSchedule schedule = WeightGradClusterSchedule::Of(n, k, rows, groups);
  const int64_t tiles = static_cast<int64_t>(groups) * schedule.m_pairs * schedule.n_tiles;
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  CUtensorMap dw_map;
  cudaError_t status =
      EncodeTensorMap<3>(&dw_map,
                         std::is_same_v<Out, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                    : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                         dw, {uk, un, static_cast<uint64_t>(groups)},
                         {uk * kOutBytes, un * uk * kOutBytes}, {kWriteColumns<Out>, 64, 1});
  if (status != cudaSuccess) return status;
  constexpr auto kKernel = &GroupedWeightGradKernel<Out>;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster;
  status = PersistentClusterLaunch<kKernel>(kWeightGradSmemBytes, kWeightGradCluster, tiles, stream,
                                            &config, &cluster);
  if (status != cudaSuccess) return status;
  status = cudaLaunchKernelEx(&config, kKernel, parts, dw_map, schedule, groups,
                              static_cast<int>(n), accumulate);
  if (status != cudaSuccess) return status;
  return cudaGetLastError();
}

}  // namespace moe::cuda::sm90
