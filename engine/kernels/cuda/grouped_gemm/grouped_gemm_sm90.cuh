// Hopper (sm_90a) grouped GEMMs for the MoE expert layers: wgmma.mma_async on operands that TMA
// loads into 128-byte-swizzled shared memory, one persistent launch per GEMM over all groups.
// Self-contained (CUDA headers only) so that tests/kernels/grouped_gemm_sm90_probe.cu builds it
// with one nvcc command; the engine's CUDA GroupedMatmul and GroupedMatmulWeightGrad reach it
// through grouped_matmul_sm90.h (contracts: op_declarations.inc).
//
// This file holds the launchers and the design note; the code lies in sm90/, one role a file:
// config.cuh (tile, stage and register sizes), pipeline.cuh (the stage ring and its mbarriers),
// mainloop.cuh (the consumers' wgmma loop), tile_scheduler.cuh (the device side of
// grouped_gemm_tiles.h), forward_producer.cuh (the forward's TMA loads), epilogue.cuh (staged
// TMA writes), swiglu_epilogue.cuh (the activation warps), split_k.cuh (the split last wave),
// weight_grad_parts.cuh (the weight gradient's K: rows in parts), forward_kernel.cuh and
// weight_grad_kernel.cuh (each kernel, its roles as force-inlined helpers), launch.cuh (tensor
// maps, launches), persistent_launch.cuh (persistent cluster launches). The FP8 grouped GEMMs
// (fp8_grouped_gemm_sm90.cuh) share these pieces.
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
//     (A load-add-store epilogue by the consumer threads was much slower than the reduce-add.)
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
//     or column tiles of the group read them again); the forward's x rows normal. The hints made
//     the weight gradients and the data gradients faster.
//   - Forward: clusters of 2 CTAs (kForwardCluster) that load a shared operand once and multicast
//     it (TMA .multicast::cluster) into both: a row pair (two 128-row tiles of one group over the
//     same 256 columns) shares w's tile, each CTA loading half; a group's odd last row tile runs
//     as column pairs (the same 128 rows, 512 columns) sharing x's rows. Each CTA's stage gets
//     48 KiB from its own and its peer's loads; a stage is empty once the consumer warps of both
//     CTAs released it (remote mbarrier arrivals), and no CTA exits before its peer (cluster
//     barrier). Without the pairing, the row tiles that share a weight tile ran on CTAs that
//     drifted apart, and each read it from DRAM: several times the weights' bytes.
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
#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/forward_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/launch.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/split_k.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/swiglu_epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_kernel.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/weight_grad_parts.cuh"

namespace moe::cuda::sm90 {

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
  return SumDscalePartials(dscale_partials, SwigluBackwardPartialTiles(f), rows, dscale, stream);
}

// dw_g (+)= sum over the `count` parts of dy_p,g^T x_p,g (see the file comment), in one launch:
// count <= kMaxWeightGradParts. Out (dw's element type) is float or bf16. Asynchronous on
// `stream`.
template <typename Out>
cudaError_t GroupedMatmulWeightGradSm90(const WeightGradRows* rows_parts, int count, int groups,
                                        int64_t n, int64_t k, bool accumulate, Out* dw,
                                        cudaStream_t stream) {
  using namespace detail;
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>, "dw is f32 or bf16");
  if (groups < 1 || count < 1 || count > kMaxWeightGradParts || !FitsInt(n) || !FitsInt(k) ||
      n % 8 != 0 || k % 8 != 0 || !Aligned16(dw)) {
    return cudaErrorInvalidValue;
  }
  WeightGradParts parts = {};
  int64_t rows = 0;  // of all parts
  const cudaError_t status = EncodeWeightGradParts(rows_parts, count, n, k, &parts, &rows);
  if (status != cudaSuccess) return status;
  if (n == 0 || k == 0) return cudaSuccess;
  if (rows == 0) {
    return accumulate
               ? cudaSuccess
               : cudaMemsetAsync(dw, 0, static_cast<size_t>(groups * n * k) * sizeof(Out), stream);
  }
  return LaunchGroupedWeightGrad(parts, rows, groups, n, k, accumulate, dw, stream);
}

}  // namespace moe::cuda::sm90
