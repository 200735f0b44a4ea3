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
//   GroupedMatmulWeightGradSm90: dw_g (+)= dy[rows of g]^T · x[rows of g]  (+= or =, f32/bf16 dw)
//     dy (rows, n), x (rows, k), dw (groups, n, k) f32 or bf16 (the launcher's Out); a bf16 dw
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
// Design (one CTA per SM, persistent; static round-robin over a linear tile order):
//   - CTA = 3 warpgroups: warpgroup 0 produces (one warp issues TMA into a 4-deep ring of
//     shared stages, setmaxnreg 40), warpgroups 1 and 2 consume (setmaxnreg 232): each owns 64
//     rows of the 128 x 256 C tile and issues m64n256k16 wgmmas, 128 f32 accumulators a thread.
//   - Stage = A 128 x 64 + B 256 x 64 bf16 (48 KiB); full[s] (TMA bytes landed) and empty[s]
//     (all 8 consumer warps done reading) mbarriers; the producer runs ahead across tiles, so
//     next tile's loads overlap this tile's epilogue.
//   - Forward tiles: group-major; within a group all m tiles of an n tile are consecutive (the
//     CTAs resident together read one weight tile from L2). Each CTA scans the offsets once into
//     shared memory (prefix of 128-row tiles per group) and binary-searches it per tile. A row
//     tile never crosses its group's end: rows past it are loaded (from the next group, or TMA's
//     zero fill past `rows`) but never stored; a consumer whose 64 rows all lie past the end
//     skips its wgmmas. K tails and N tails: TMA zero-fills outside the tensors (w is a 3-D map
//     with the group as its outer dimension, so no read crosses into the next expert).
//   - Weight-gradient tiles: (group, 128 rows of n, 256 columns of k); K = the group's rows, in
//     64-row steps. A K step past the group's end would read the next group's rows, so the
//     producer lands such a stage on a separate mbarrier, zeroes the 128-byte lines of the rows
//     past the end in every box (both operands, so Inf/NaN in a neighbour cannot leak as 0 * Inf),
//     fences (fence.proxy.async) and only then arrives on full[s].
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
#include <cstdint>
#include <type_traits>

// wgmma and setmaxnreg exist only on sm_90a. nvcc -arch=sm_90a also embeds generic compute_90
// PTX; in that pass (and for any other GPU) the kernels are built as a trap.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_SM90A_KERNELS 1
#else
#define MOE_SM90A_KERNELS 0
#endif

namespace moe::cuda::sm90 {

using bf16 = __nv_bfloat16;

constexpr int kBlockM = 128;  // C rows per tile: 64 per consumer warpgroup
constexpr int kBlockN = 256;  // C columns per tile: one m64n256k16 per consumer and K slice
constexpr int kBlockK = 64;   // reduction step: 64 bf16 = one 128-byte swizzle row
constexpr int kWgmmaK = 16;
constexpr int kForwardStages = 4;     // 4 x 48 KiB, beside the offsets (8 KiB)
constexpr int kWeightGradStages = 4;  // 4 x 48 KiB, beside the write staging (32 KiB)
constexpr int kConsumers = 2;
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
constexpr int kConsumerWarps = kConsumers * 4;
constexpr int kAccumulators = 64 * kBlockN / kWarpgroupThreads;  // f32 per consumer thread
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kMaxGroups = 1024;  // forward: the per-CTA copies of the offsets in shared memory

constexpr int kSwizzleRowBytes = 128;
constexpr int kBoxBytes = 64 * kSwizzleRowBytes;  // a 64 x 64 bf16 box: 8 KiB
constexpr int kStageABytes = kBlockM * kBlockK * 2;
constexpr int kStageBBytes = kBlockN * kBlockK * 2;
constexpr int kStageBytes = kStageABytes + kStageBBytes;
constexpr int kKMajorSliceBytes = kWgmmaK * 2;                  // next 16 K values in a row
constexpr int kMNMajorSliceBytes = kWgmmaK * kSwizzleRowBytes;  // next 16 K rows
constexpr int kCoreGroupBytes = 8 * kSwizzleRowBytes;           // SBO: the next 8 rows

// Weight-gradient TMA writes (reduce-add or store): each consumer writes its 64 x 256 result (dw
// element type Out) in chunks of 64 rows x kWriteColumns<Out> columns (one 128-byte swizzle row
// per tile row: 32 f32 or 64 bf16), through kWriteBuffers staging buffers; that many chunks'
// writes can be in flight while it goes on.
template <typename Out>
constexpr int kWriteColumns = kSwizzleRowBytes / sizeof(Out);
constexpr int kWriteChunkBytes = 64 * kSwizzleRowBytes;  // 8 KiB, either type
constexpr int kWriteBuffers = 2;
static_assert((kBlockN / kWriteColumns<float>) % kWriteBuffers == 0 &&
                  (kBlockN / kWriteColumns<bf16>) % kWriteBuffers == 0,
              "each tile's first chunk must reuse the buffer of the previous tile's oldest chunk");

static_assert(kBlockK * 2 == kSwizzleRowBytes);
static_assert(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0 && kBoxBytes % 1024 == 0);
static_assert(kBlockM == 64 * kConsumers && kBlockN % 64 == 0 && kBlockN / 8 * 4 == kAccumulators);
static_assert(kProducerRegisters * kWarpgroupThreads +
                  kConsumerRegisters * kWarpgroupThreads * kConsumers <=
              65536);

namespace detail {

// ---------------------------------------------------------------- PTX wrappers

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA) and to the other threads
// (with the __syncthreads that follows).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival that also expects `bytes` of asynchronous (TMA) writes before the phase completes.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Returns once the phase of parity `parity` has completed (acquire: what the arrivals released,
// including the TMA bytes, is visible afterwards).
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ uint64_t MapAddress(const CUtensorMap& map) {
  return reinterpret_cast<uint64_t>(&map);
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap& map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(MapAddress(map)) : "memory");
}

// TMA: the box at coordinates (c0 innermost, c1[, c2]) of `map` into shared `dst`; its bytes
// complete_tx on `bar`.
__device__ __forceinline__ void TmaLoad2d(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                          int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void TmaLoad3d(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                          int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// TMA: global box (c0, c1, c2) of `map` = shared `src`, or += (element-wise, in L2) when
// `reduce_add`; joins the thread's current bulk group.
__device__ __forceinline__ void TmaWrite3d(bool reduce_add, const CUtensorMap& map, uint32_t src,
                                           int c0, int c1, int c2) {
#define MOE_TMA_WRITE_3D(instruction)                                                              \
  asm volatile(instruction " [%0, {%2, %3, %4}], [%1];" ::"l"(MapAddress(map)), "r"(src), "r"(c0), \
               "r"(c1), "r"(c2)                                                                    \
               : "memory")
  if (reduce_add) {
    MOE_TMA_WRITE_3D("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group");
  } else {
    MOE_TMA_WRITE_3D("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group");
  }
#undef MOE_TMA_WRITE_3D
}

__device__ __forceinline__ void BulkCommitGroup() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups still read their shared source.
template <int kPending>
__device__ __forceinline__ void BulkWaitGroupRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Waits until all of this thread's bulk groups have completed.
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (wgmma operand reads, TMA stores) that are synchronised after it.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int kRegisters>
__device__ __forceinline__ void IncreaseMaxRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void DecreaseMaxRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void WgmmaCommitGroup() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most kPending of the warpgroup's committed wgmma groups are in flight.
template <int kPending>
__device__ __forceinline__ void WgmmaWaitGroup() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// v as lane 0 has it. Values that steer wgmma issue must be provably warp-uniform: ptxas
// serialises wgmmas that sit behind branches it cannot prove uniform (warning C7518).
__device__ __forceinline__ int WarpUniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

using Accumulators = float[kAccumulators];

__device__ __forceinline__ void FenceAccumulators(Accumulators& d) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 256 f32, this warpgroup's accumulators) = a (64 x 16) · b (16 x 256) (+ d when
// `accumulate`), bf16 operands in shared memory given by descriptors; kTransposeA/B: 0 K-major,
// 1 MN-major.
template <int kTransposeA, int kTransposeB>
__device__ __forceinline__ void WgmmaM64N256K16(Accumulators& d, uint64_t a, uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
      "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, "
      "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, "
      "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, %131, %132;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransposeA), "n"(kTransposeB));
}

// ---------------------------------------------------------------- shared-memory operands

// Descriptor of a 128B-swizzled operand at shared address `start` (1024-byte aligned up to the
// K-slice offsets added to it, which only touch address bits below 7 or at 11 and above).
__device__ __forceinline__ uint64_t SmemDescriptor(uint32_t start, uint32_t leading_bytes,
                                                   uint32_t stride_bytes) {
  return static_cast<uint64_t>((start & 0x3FFFF) >> 4) |
         static_cast<uint64_t>(leading_bytes >> 4) << 16 |
         static_cast<uint64_t>(stride_bytes >> 4) << 32 | uint64_t{1} << 62;
}

// Rows of 64 K values (a token-row tile, or (out, in) weight rows) as TMA lays out one box.
__device__ __forceinline__ uint64_t KMajorDescriptor(uint32_t start, int k_slice) {
  return SmemDescriptor(start + k_slice * kKMajorSliceBytes, 16, kCoreGroupBytes);
}

// K rows of 64 M or N values, in 64 x 64 boxes kBoxBytes apart along M or N.
__device__ __forceinline__ uint64_t MNMajorDescriptor(uint32_t start, int k_slice) {
  return SmemDescriptor(start + k_slice * kMNMajorSliceBytes, kBoxBytes, kCoreGroupBytes);
}

// ---------------------------------------------------------------- pipeline

template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;

  __device__ void Advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The mbarriers of the stage ring: full[s] (operands landed), empty[s] (consumers done), and
// landed[s] (weight gradient only: the TMA bytes of a stage the producer still has to mask).
template <int kStages>
struct StageBarriers {
  uint32_t base;  // shared address of full[0]; empty and landed follow, kStages each

  __device__ uint32_t Full(int stage) const { return base + 8 * stage; }
  __device__ uint32_t Empty(int stage) const { return base + 8 * (kStages + stage); }
  __device__ uint32_t Landed(int stage) const { return base + 8 * (2 * kStages + stage); }

  static constexpr int kBytes = 3 * kStages * 8;

  __device__ void Init() const {
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(Full(s), 1);
      MbarrierInit(Empty(s), kConsumerWarps);
      MbarrierInit(Landed(s), 1);
    }
    FenceBarrierInit();
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
  __device__ StageBarriers<kStages> Barriers() const {
    return {SmemAddress(base) + kStages * kStageBytes};
  }
  // Bytes past the barriers, for the kernel's own use (1024-byte aligned).
  __device__ uint8_t* Extra() const {
    return base + kStages * kStageBytes + ((StageBarriers<kStages>::kBytes + 1023) & ~1023);
  }
  static constexpr int kBytesBeforeExtra =
      1023 + kStages * kStageBytes + ((StageBarriers<kStages>::kBytes + 1023) & ~1023);
};

// Consumer side of k_blocks stages: this warpgroup's 64 x 256 accumulators = A · B over them
// when `active` (a_descriptor(stage, k_slice), b_descriptor(stage, k_slice) give the operands);
// an inactive warpgroup (its rows lie outside C) only releases the stages. Keeps one wgmma
// group in flight: a stage is released once the group after it has been issued and its own
// group has completed. Every consumer warp arrives once per stage on empty.
template <int kTransposeA, int kTransposeB, int kStages, typename ADescriptor, typename BDescriptor>
__device__ __forceinline__ void MultiplyStages(Accumulators& acc, int k_blocks, bool active,
                                               const StageBarriers<kStages>& barriers,
                                               PipelineState<kStages>& state,
                                               ADescriptor a_descriptor, BDescriptor b_descriptor) {
  const bool warp_leader = threadIdx.x % 32 == 0;
  int unreleased = -1;  // the stage whose wgmma group may still be reading it
  for (int kb = 0; kb < k_blocks; ++kb) {
    MbarrierWait(barriers.Full(state.stage), state.phase);
    if (active) {
      FenceAccumulators(acc);
      WgmmaFence();
#pragma unroll
      for (int slice = 0; slice < kBlockK / kWgmmaK; ++slice) {
        WgmmaM64N256K16<kTransposeA, kTransposeB>(acc, a_descriptor(state.stage, slice),
                                                  b_descriptor(state.stage, slice),
                                                  kb > 0 || slice > 0);
      }
      WgmmaCommitGroup();
      WgmmaWaitGroup<1>();
      FenceAccumulators(acc);
      if (unreleased >= 0 && warp_leader) MbarrierArrive(barriers.Empty(unreleased));
      unreleased = state.stage;
    } else if (warp_leader) {
      MbarrierArrive(barriers.Empty(state.stage));
    }
    state.Advance();
  }
  // Also when inactive (nothing in flight: returns at once), so that every path to the
  // accumulators' next use passes a wait and ptxas need not inject one.
  WgmmaWaitGroup<0>();
  FenceAccumulators(acc);
  if (unreleased >= 0 && warp_leader) MbarrierArrive(barriers.Empty(unreleased));
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

// ---------------------------------------------------------------- forward: row tiles

struct RowTile {
  int group;
  int row_begin, row_end;  // the tile's rows [row_begin, min(row_begin + kBlockM, row_end))
  int n0;                  // first column of C

  __device__ RowTile WarpUniform() const {
    return {detail::WarpUniform(group), detail::WarpUniform(row_begin),
            detail::WarpUniform(row_end), detail::WarpUniform(n0)};
  }
};

// Shared-memory copies of the offsets (groups + 1) and of tile_prefix (groups + 1): row tiles
// of the groups before g, each group covered by ceil(rows_g / kBlockM) tiles.
struct RowTileSchedule {
  const int* offsets;
  const int* tile_prefix;
  int groups;
  int n_tiles;

  __device__ int Total() const { return tile_prefix[groups] * n_tiles; }

  // Tile t of Total(): group-major, then n tile, then row tile. Group g's tiles are
  // [tile_prefix[g] n_tiles, tile_prefix[g + 1] n_tiles), so g is the last group with
  // tile_prefix[g] <= t / n_tiles (an empty group never is: the next one has the same prefix).
  __device__ RowTile Find(int t) const {
    const int row_tile = t / n_tiles;
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tile_prefix[mid] <= row_tile) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int count = tile_prefix[lo + 1] - tile_prefix[lo];
    const int local = t - tile_prefix[lo] * n_tiles;
    return {lo, offsets[lo] + local % count * kBlockM, offsets[lo + 1], local / count * kBlockN};
  }
};

// Fills `offsets` (groups + 1) from device memory and tile_prefix from them; the whole CTA calls
// it. Traps unless 0 = offsets[0] <= ... <= offsets[groups] = rows.
__device__ __forceinline__ void BuildRowTileSchedule(const int32_t* device_offsets, int groups,
                                                     int rows, int* offsets, int* tile_prefix) {
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
        count = (offsets[g + 1] - offsets[g] + kBlockM - 1) / kBlockM;
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

// y rows [row, row_end) and [row + 8, row_end) of this thread's fragment, columns below n.
__device__ __forceinline__ void StoreRows(const Accumulators& acc, bf16* y, int n, int row,
                                          int row_end, int column) {
  bf16* const first = y + static_cast<int64_t>(row) * n;
  bf16* const second = first + static_cast<int64_t>(8) * n;
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
    const int c = column + 8 * i;
    if (c < n) {  // n is a multiple of 8, so c + 1 < n too
      if (row < row_end) {
        *reinterpret_cast<__nv_bfloat162*>(first + c) =
            __floats2bfloat162_rn(acc[4 * i], acc[4 * i + 1]);
      }
      if (row + 8 < row_end) {
        *reinterpret_cast<__nv_bfloat162*>(second + c) =
            __floats2bfloat162_rn(acc[4 * i + 2], acc[4 * i + 3]);
      }
    }
  }
}

// ---------------------------------------------------------------- weight gradient: tiles

struct WeightGradTile {
  int group;
  int m0, n0;              // dw_g rows [m0, m0 + kBlockM) (of n), columns [n0, n0 + kBlockN) (of k)
  int row_begin, row_end;  // the group's token rows: the reduction

  __device__ WeightGradTile WarpUniform() const {
    return {detail::WarpUniform(group), detail::WarpUniform(m0), detail::WarpUniform(n0),
            detail::WarpUniform(row_begin), detail::WarpUniform(row_end)};
  }
};

// Tile t: group-major, then k columns, then n rows (the CTAs resident together share x_g's
// columns). Traps on offsets outside 0 <= offsets[g] <= offsets[g + 1] <= rows.
__device__ __forceinline__ WeightGradTile FindWeightGradTile(int t, const int32_t* offsets,
                                                             int rows, int m_tiles, int n_tiles) {
  const int group = t / (m_tiles * n_tiles);
  const int local = t % (m_tiles * n_tiles);
  const int begin = offsets[group], end = offsets[group + 1];
  if (begin < 0 || begin > end || end > rows) __trap();
  return {group, local % m_tiles * kBlockM, local / m_tiles * kBlockN, begin, end};
}

// Zeroes the 128-byte lines of rows [valid, 64) of the stage's six 64-row boxes (A: 2, B: 4),
// the K rows past the group's end; the producer warp calls it (all lanes).
__device__ __forceinline__ void ZeroRowsPastEnd(uint8_t* a, uint8_t* b, int valid) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int line = valid + lane / 8; line < 64; line += 4) {
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

// dw_g[tile rows, tile columns] += (accumulate: TMA reduce-add) or = (TMA store) this
// warpgroup's accumulators as Out, in 64 x kWriteColumns<Out> chunks staged through
// kWriteBuffers 128B-swizzled buffers (from shared address `staging`); TMA clips the boxes to dw.
// The warpgroup's thread 0 issues the writes and waits for a buffer's previous write to have read
// it before the warpgroup refills it (named barrier `barrier_id`).
template <typename Out>
__device__ __forceinline__ void WriteTile(const Accumulators& acc, const CUtensorMap& dw_map,
                                          uint32_t staging, int barrier_id, int group, int row0,
                                          int column0, bool accumulate) {
  constexpr int kColumns = kWriteColumns<Out>;
  const FragmentPosition at;
  const bool leader = threadIdx.x % kWarpgroupThreads == 0;
  const int row = at.Row();
  // Row r's 16-byte chunk c lies at chunk c ^ (r % 8); Row() % 8 = lane / 4, also for Row() + 8.
  const int swizzle = at.lane / 4;
#pragma unroll
  for (int chunk = 0; chunk < kBlockN / kColumns; ++chunk) {
    const uint32_t buffer = staging + chunk % kWriteBuffers * kWriteChunkBytes;
    if (leader) BulkWaitGroupRead<kWriteBuffers - 1>();
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
#pragma unroll
    for (int j = 0; j < kColumns / 8; ++j) {
      const int i = chunk * (kColumns / 8) + j;  // accumulator column block
      const int byte = (8 * j + at.Column()) * static_cast<int>(sizeof(Out));  // in the row
      const int offset = ((byte / 16) ^ swizzle) * 16 + byte % 16;
      const uint32_t first = buffer + row * kSwizzleRowBytes + offset;
      StorePair<Out>(first, acc[4 * i], acc[4 * i + 1]);
      StorePair<Out>(first + 8 * kSwizzleRowBytes, acc[4 * i + 2], acc[4 * i + 3]);
    }
    FenceProxyAsync();
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
    if (leader) {
      const int column = column0 + chunk * kColumns;
      TmaWrite3d(accumulate, dw_map, buffer, column, row0, group);
      BulkCommitGroup();
    }
  }
}

// ---------------------------------------------------------------- kernels

// y = x · op(w) per group (see the file comment). x_map: x as (k, rows), box (64, 128);
// w_map: w as (k, n, groups), box (64, 256, 1) when kTransposeW, else (n, k, groups), box
// (64, 64, 1) loaded 4 times per stage along n.
template <bool kTransposeW>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedMatmulKernel(const __grid_constant__ CUtensorMap x_map,
                        const __grid_constant__ CUtensorMap w_map, const int32_t* device_offsets,
                        int groups, int rows, int n, int k, bf16* y) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const StageRing<kForwardStages> ring(smem_raw);
  const StageBarriers<kForwardStages> barriers = ring.Barriers();
  int* const offsets = reinterpret_cast<int*>(ring.Extra());
  int* const tile_prefix = offsets + kMaxGroups + 1;
  if (threadIdx.x == 0) barriers.Init();
  BuildRowTileSchedule(device_offsets, groups, rows, offsets, tile_prefix);
  const RowTileSchedule schedule{offsets, tile_prefix, groups, (n + kBlockN - 1) / kBlockN};
  const int total = WarpUniform(schedule.Total());
  const int k_blocks = (k + kBlockK - 1) / kBlockK;
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);

  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    PrefetchTensorMap(x_map);
    PrefetchTensorMap(w_map);
    PipelineState<kForwardStages> state;
    for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
      const RowTile tile = schedule.Find(t);
      for (int kb = 0; kb < k_blocks; ++kb) {
        MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
        const uint32_t full = barriers.Full(state.stage);
        MbarrierArriveExpectTx(full, kStageBytes);
        TmaLoad2d(x_map, ring.A(state.stage), full, kb * kBlockK, tile.row_begin);
        if constexpr (kTransposeW) {
          TmaLoad3d(w_map, ring.B(state.stage), full, kb * kBlockK, tile.n0, tile.group);
        } else {
#pragma unroll
          for (int box = 0; box < kBlockN / 64; ++box) {
            TmaLoad3d(w_map, ring.B(state.stage) + box * kBoxBytes, full, tile.n0 + 64 * box,
                      kb * kBlockK, tile.group);
          }
        }
        state.Advance();
      }
    }
    return;
  }

  IncreaseMaxRegisters<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const FragmentPosition at;
  Accumulators acc;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  PipelineState<kForwardStages> state;
  for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
    const RowTile tile = schedule.Find(t).WarpUniform();
    const int first_row = tile.row_begin + 64 * consumer;
    const bool active = first_row < tile.row_end;
    const auto a_descriptor = [&](int stage, int slice) {
      return KMajorDescriptor(ring.A(stage) + consumer * kBoxBytes, slice);
    };
    const auto b_descriptor = [&](int stage, int slice) {
      return kTransposeW ? KMajorDescriptor(ring.B(stage), slice)
                         : MNMajorDescriptor(ring.B(stage), slice);
    };
    MultiplyStages<0, kTransposeW ? 0 : 1>(acc, k_blocks, active, barriers, state, a_descriptor,
                                           b_descriptor);
    if (active) StoreRows(acc, y, n, first_row + at.Row(), tile.row_end, tile.n0 + at.Column());
  }
#else
  __trap();
#endif
}

// dw_g (+)= dy_g^T · x_g (see the file comment). dy_map: dy as (n, rows), x_map: x as (k, rows),
// both box (64, 64) (MN-major operands: each token row is a K row); dw_map: dw (Out) as
// (k, n, groups), box (kWriteColumns<Out>, 64, 1).
template <typename Out>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedWeightGradKernel(const __grid_constant__ CUtensorMap dy_map,
                            const __grid_constant__ CUtensorMap x_map,
                            const __grid_constant__ CUtensorMap dw_map, const int32_t* offsets,
                            int groups, int rows, int n, int k, bool accumulate) {
#if MOE_SM90A_KERNELS
  extern __shared__ uint8_t smem_raw[];
  const StageRing<kWeightGradStages> ring(smem_raw);
  const StageBarriers<kWeightGradStages> barriers = ring.Barriers();
  if (threadIdx.x == 0) barriers.Init();
  __syncthreads();
  const int m_tiles = (n + kBlockM - 1) / kBlockM;
  const int n_tiles = (k + kBlockN - 1) / kBlockN;
  const int total = groups * m_tiles * n_tiles;
  const int warpgroup = WarpUniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);

  if (warpgroup == 0) {
    DecreaseMaxRegisters<kProducerRegisters>();
    if (threadIdx.x >= 32) return;
    const bool issuer = threadIdx.x == 0;
    if (issuer) {
      PrefetchTensorMap(dy_map);
      PrefetchTensorMap(x_map);
    }
    PipelineState<kWeightGradStages> state;
    uint32_t landed_phases = 0;  // bit s: parity of landed[s]'s next phase
    static_assert(kWeightGradStages <= 32);
    for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
      const WeightGradTile tile = FindWeightGradTile(t, offsets, rows, m_tiles, n_tiles);
      for (int row = tile.row_begin; row < tile.row_end; row += kBlockK) {
        MbarrierWait(barriers.Empty(state.stage), state.phase ^ 1);
        const int valid = min(kBlockK, tile.row_end - row);
        const uint32_t landing =
            valid < kBlockK ? barriers.Landed(state.stage) : barriers.Full(state.stage);
        if (issuer) {
          MbarrierArriveExpectTx(landing, kStageBytes);
#pragma unroll
          for (int box = 0; box < kBlockM / 64; ++box) {
            TmaLoad2d(dy_map, ring.A(state.stage) + box * kBoxBytes, landing, tile.m0 + 64 * box,
                      row);
          }
#pragma unroll
          for (int box = 0; box < kBlockN / 64; ++box) {
            TmaLoad2d(x_map, ring.B(state.stage) + box * kBoxBytes, landing, tile.n0 + 64 * box,
                      row);
          }
        }
        if (valid < kBlockK) {
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
    return;
  }

  IncreaseMaxRegisters<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const uint32_t staging = SmemAddress(ring.Extra() + consumer * kWriteBuffers * kWriteChunkBytes);
  Accumulators acc;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  PipelineState<kWeightGradStages> state;
  for (int t = static_cast<int>(blockIdx.x); t < total; t += static_cast<int>(gridDim.x)) {
    const WeightGradTile tile =
        FindWeightGradTile(t, offsets, rows, m_tiles, n_tiles).WarpUniform();
    const int k_blocks = (tile.row_end - tile.row_begin + kBlockK - 1) / kBlockK;
    if (k_blocks == 0 && accumulate) continue;  // no rows: dw_g stays as it is
    const int row0 = tile.m0 + 64 * consumer;
    const bool active = row0 < n;
    const auto a_descriptor = [&](int stage, int slice) {
      return MNMajorDescriptor(ring.A(stage) + consumer * kBoxBytes, slice);
    };
    const auto b_descriptor = [&](int stage, int slice) {
      return MNMajorDescriptor(ring.B(stage), slice);
    };
    MultiplyStages<1, 1>(acc, k_blocks, active, barriers, state, a_descriptor, b_descriptor);
    if (!active) continue;
    if (k_blocks == 0) {  // no rows, and dw_g =: zeros (no wgmma cleared the accumulators)
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    }
    WriteTile<Out>(acc, dw_map, staging, 1 + consumer, tile.group, row0, tile.n0, accumulate);
  }
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
#else
  __trap();
#endif
}

// ---------------------------------------------------------------- host

constexpr int kForwardSmemBytes =
    StageRing<kForwardStages>::kBytesBeforeExtra + 2 * (kMaxGroups + 1) * 4;
constexpr int kWeightGradSmemBytes =
    StageRing<kWeightGradStages>::kBytesBeforeExtra + kConsumers * kWriteBuffers * kWriteChunkBytes;
static_assert(kForwardSmemBytes <= 227 * 1024);
static_assert(kWeightGradSmemBytes <= 227 * 1024);

inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

// A 128B-swizzled tiled map of a row-major tensor: dims innermost first (elements), strides of
// dims 1.. in bytes, box in elements (inner box = 128 bytes); zeros outside the tensor.
template <int kRank>
cudaError_t EncodeTensorMap(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                            const uint64_t (&dims)[kRank], const uint64_t (&strides)[kRank - 1],
                            const uint32_t (&box)[kRank]) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  uint32_t element_strides[kRank];
  std::fill_n(element_strides, kRank, 1u);
  const CUresult result =
      encode(map, type, kRank, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline bool FitsInt(int64_t v) { return v >= 0 && v < (int64_t{1} << 31); }

// Persistent grid: one CTA per SM, at most `tiles`.
inline cudaError_t PersistentGrid(int64_t tiles, int* grid) {
  int device = 0, sms = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  *grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(sms, tiles)));
  return status;
}

}  // namespace detail

// See the file comment. Asynchronous on `stream`; returns the first error of argument checks,
// tensor-map encoding or the launch.
inline cudaError_t GroupedMatmulSm90(const bf16* x, const bf16* w, const int32_t* offsets,
                                     int groups, int64_t rows, int64_t n, int64_t k,
                                     bool transpose_w, bf16* y, cudaStream_t stream) {
  using namespace detail;
  if (groups < 1 || groups > kMaxGroups || !FitsInt(rows) || !FitsInt(n) || !FitsInt(k) ||
      n % 8 != 0 || k % 8 != 0 || !Aligned16(x) || !Aligned16(w) || !Aligned16(y)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || n == 0) return cudaSuccess;
  if (k == 0) return cudaMemsetAsync(y, 0, static_cast<size_t>(rows * n) * sizeof(bf16), stream);
  CUtensorMap x_map, w_map;
  const uint64_t g = static_cast<uint64_t>(groups);
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k);
  cudaError_t status =
      EncodeTensorMap<2>(&x_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x,
                         {uk, static_cast<uint64_t>(rows)}, {uk * 2}, {kBlockK, kBlockM});
  if (status != cudaSuccess) return status;
  status = transpose_w
               ? EncodeTensorMap<3>(&w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, {uk, un, g},
                                    {uk * 2, un * uk * 2}, {kBlockK, kBlockN, 1})
               : EncodeTensorMap<3>(&w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, {un, uk, g},
                                    {un * 2, un * uk * 2}, {64, kBlockK, 1});
  if (status != cudaSuccess) return status;
  const auto kernel = transpose_w ? GroupedMatmulKernel<true> : GroupedMatmulKernel<false>;
  status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kForwardSmemBytes);
  if (status != cudaSuccess) return status;
  // Row tiles: sum_g ceil(rows_g / kBlockM) <= (rows + groups (kBlockM - 1)) / kBlockM.
  const int64_t tiles = (rows + static_cast<int64_t>(groups) * (kBlockM - 1)) / kBlockM *
                        ((n + kBlockN - 1) / kBlockN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  int grid = 0;
  status = PersistentGrid(tiles, &grid);
  if (status != cudaSuccess) return status;
  kernel<<<grid, kThreads, kForwardSmemBytes, stream>>>(x_map, w_map, offsets, groups,
                                                        static_cast<int>(rows), static_cast<int>(n),
                                                        static_cast<int>(k), y);
  return cudaGetLastError();
}

// See the file comment; Out (dw's element type) is float or bf16. Asynchronous on `stream`.
template <typename Out>
cudaError_t GroupedMatmulWeightGradSm90(const bf16* dy, const bf16* x, const int32_t* offsets,
                                        int groups, int64_t rows, int64_t n, int64_t k,
                                        bool accumulate, Out* dw, cudaStream_t stream) {
  using namespace detail;
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>, "dw is f32 or bf16");
  constexpr uint64_t kOutBytes = sizeof(Out);
  if (groups < 1 || !FitsInt(rows) || !FitsInt(n) || !FitsInt(k) || n % 8 != 0 || k % 8 != 0 ||
      !Aligned16(dy) || !Aligned16(x) || !Aligned16(dw)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 || k == 0) return cudaSuccess;
  if (rows == 0) {
    return accumulate
               ? cudaSuccess
               : cudaMemsetAsync(dw, 0, static_cast<size_t>(groups * n * k) * kOutBytes, stream);
  }
  const int64_t tiles =
      static_cast<int64_t>(groups) * ((n + kBlockM - 1) / kBlockM) * ((k + kBlockN - 1) / kBlockN);
  if (!FitsInt(tiles)) return cudaErrorInvalidValue;
  CUtensorMap dy_map, x_map, dw_map;
  const uint64_t ur = static_cast<uint64_t>(rows), un = static_cast<uint64_t>(n),
                 uk = static_cast<uint64_t>(k);
  cudaError_t status = EncodeTensorMap<2>(&dy_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, dy, {un, ur},
                                          {un * 2}, {64, kBlockK});
  if (status != cudaSuccess) return status;
  status = EncodeTensorMap<2>(&x_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, {uk, ur}, {uk * 2},
                              {64, kBlockK});
  if (status != cudaSuccess) return status;
  status = EncodeTensorMap<3>(&dw_map,
                              std::is_same_v<Out, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                              dw, {uk, un, static_cast<uint64_t>(groups)},
                              {uk * kOutBytes, un * uk * kOutBytes}, {kWriteColumns<Out>, 64, 1});
  if (status != cudaSuccess) return status;
  status = cudaFuncSetAttribute(GroupedWeightGradKernel<Out>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, kWeightGradSmemBytes);
  if (status != cudaSuccess) return status;
  int grid = 0;
  status = PersistentGrid(tiles, &grid);
  if (status != cudaSuccess) return status;
  GroupedWeightGradKernel<Out><<<grid, kThreads, kWeightGradSmemBytes, stream>>>(
      dy_map, x_map, dw_map, offsets, groups, static_cast<int>(rows), static_cast<int>(n),
      static_cast<int>(k), accumulate);
  return cudaGetLastError();
}

}  // namespace moe::cuda::sm90
