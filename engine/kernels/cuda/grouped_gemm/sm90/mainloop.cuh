// The consumers' mainloop of the Hopper grouped GEMMs (design: ../grouped_gemm_sm90.cuh): each
// consumer warpgroup's 64 x 256 f32 accumulators = A · B over a run of stages (m64n256k16 wgmmas
// on shared-memory descriptors, one wgmma group in flight), releasing each stage once read; the
// issue of a stage's wgmmas as deep as its K slices with rows (also the FP8 kernels'); and where a
// thread's accumulators sit in the tile.
#pragma once

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/pipeline.cuh"

namespace moe::cuda::sm90::detail {

using Accumulators = float[kAccumulators];

// Rows of 64 K values (a token-row tile, or (out, in) weight rows) as TMA lays out one box.
__device__ __forceinline__ uint64_t KMajorDescriptor(uint32_t start, int k_slice) {
  return SmemDescriptor(start + k_slice * kKMajorSliceBytes, 16, kCoreGroupBytes);
}

// K rows of 64 M or N values, in 64 x 64 boxes kBoxBytes apart along M or N.
__device__ __forceinline__ uint64_t MNMajorDescriptor(uint32_t start, int k_slice) {
  return SmemDescriptor(start + k_slice * kMNMajorSliceBytes, kBoxBytes, kCoreGroupBytes);
}

// Every stage's K slices hold data (MultiplyStages' default).
struct WholeStages {
  __device__ int operator()() const { return kBlockK / kWgmmaK; }
};

// issue.template operator()<kSlices>() for `slices` (warp-uniform) from 1 to 4 (4 or more: 4):
// one straight wgmma sequence per slice count, as ptxas fences every wgmma of a sequence with
// branches inside it.
template <typename Issue>
__device__ __forceinline__ void IssueSlices(int slices, Issue issue) {
  if (slices >= 4) {
    issue.template operator()<4>();
  } else if (slices == 3) {
    issue.template operator()<3>();
  } else if (slices == 2) {
    issue.template operator()<2>();
  } else {
    issue.template operator()<1>();
  }
}

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
      static_assert(kBlockK / kWgmmaK == 4, "IssueSlices issues up to 4 slices");
      IssueSlices(slices, [&]<int kSlices>() {
        FenceAccumulators(acc);
        WgmmaFence();
#pragma unroll
        for (int slice = 0; slice < kSlices; ++slice) {
          WgmmaSS<kTransposeA, kTransposeB>(acc, a_descriptor(state.stage, slice),
                                            b_descriptor(state.stage, slice), kb > 0 || slice > 0);
        }
        WgmmaCommitGroup();
      });
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

}  // namespace moe::cuda::sm90::detail
