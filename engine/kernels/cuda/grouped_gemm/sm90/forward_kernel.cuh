// The Hopper grouped GEMMs' forward kernel (design: ../grouped_gemm_sm90.cuh): y = x · op(w) per
// group, with a store epilogue or a SwiGLU one, as a persistent launch of warp-specialised CTAs
// in clusters of two. Warpgroup 0's thread 0 produces (forward_producer.cuh), its warps 1-3 run
// the SwiGLU epilogues (swiglu_epilogue.cuh), and warpgroups 1 and 2 consume: the mainloop
// (mainloop.cuh), the split tail's partials (split_k.cuh) and the tile's epilogue (epilogue.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/forward_producer.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/pipeline.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/split_k.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/swiglu_epilogue.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/tile_scheduler.cuh"

namespace moe::cuda::sm90::detail {

// The forward kernel's shared memory: kStages operand stages and each consumer's output staging,
// beside the offsets and the hand-over barriers. A plain product with transpose_w (fc2's forward)
// gets 4 stages and one box of staging (its result written in 4 rounds); the others keep 3 stages
// beside a staging that holds the whole result (the hand-over epilogues need it). The fourth stage
// pays for fc2's forward at every model shape; without transpose_w (the data gradients) it helped
// fc1's at one shape and slowed fc2's, so that kernel keeps 3.
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

// The activation warps of the forward kernel's hand-over epilogues (warps 1-3 of warpgroup 0;
// see GroupedMatmulKernel): for each of this cluster's tiles (no split: unit t is tile t) and
// each active consumer's part of it, waits until the consumer has staged its result, computes
// SwiGLU's output (kSwiglu) or gradients from it, and tells the consumer the staging is read.
// For the gradients, it first asks for the tile's gate and up values in L2.
template <bool kSwiglu, int kStagingBytes, int kStages>
__device__ __forceinline__ void RunActivationWarps(const SwigluOperands& swiglu,
                                                   const StageRing<kStages>& ring,
                                                   const ActivationBarriers& activation,
                                                   const ClusterTileSchedule& schedule,
                                                   const RoundRobin& tiles, int rank, int rows,
                                                   int n, int f) {
  const int thread = static_cast<int>(threadIdx.x) - (kWarpgroupThreads - kActivationThreads);
  uint32_t staged_phases = 0;  // bit c: parity of staged[c]'s next phase
  for (int t = tiles.first; t < tiles.end; t += tiles.step) {
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
        WriteSwigluGradients(staged, thread / 32, swiglu, rows, f, part.first_row, part.valid_rows,
                             part.column);
      }
      MbarrierArrive(activation.Read(consumer));
    }
  }
}

// A consumer's tile epilogue in the forward kernel, by kEpilogue: kStore writes its rows of y
// (TMA boxes for 64 rows, else copied by the threads: no store past the group's end), kSwiglu
// the same as y's gate and up halves (tile columns [0, kBlockN / 2) are gate columns from
// column / 2, the rest their up columns), and kSwigluBackward only stages the result as bf16 for
// the activation warps. staging / staging_generic: the consumer's staging as a shared and a
// generic address; barrier: its named barrier.
template <Epilogue kEpilogue, int kStagingBytes>
__device__ __forceinline__ void WriteForwardTile(const Accumulators& acc, const CUtensorMap& y_map,
                                                 bf16* y, uint8_t* staging_generic,
                                                 uint32_t staging, int barrier,
                                                 const ConsumerTile& part, int n, int f) {
  const int first_row = part.first_row, column = part.column, valid_rows = part.valid_rows;
  if constexpr (kEpilogue == Epilogue::kStore) {
    WriteOutputRows<bf16, kStagingBytes>(acc, y_map, y, staging, staging_generic, barrier,
                                         first_row, column, valid_rows, n);
  } else if constexpr (kEpilogue == Epilogue::kSwiglu) {
    // Tile columns [0, kHalf) are y's gate columns from `gate`, [kHalf, kBlockN) its up
    // columns.
    const int gate = column / 2;
    constexpr int kHalf = kBlockN / 2;
    if (valid_rows == 64) {
      WriteTile<bf16, kStagingBytes>(acc, y_map, staging, barrier, false, [&](int c) {
        return BoxOrigin{gate + c % kHalf, c / kHalf, first_row};
      });
    } else {
      WriteRows<bf16, kStagingBytes>(acc, staging_generic, barrier, valid_rows, [&](int r, int c) {
        const int64_t row = first_row + r;
        return gate + c % kHalf < f ? y + row * n + c / kHalf * f + gate + c % kHalf : nullptr;
      });
    }
  } else {  // kSwigluBackward: da is only staged, for the activation warps
    StageColumns<bf16, kBlockN>(acc, staging, 0);
  }
}

// Consumer warpgroup `consumer` (0 or 1) of the forward kernel: for each of this cluster's units,
// its 64 rows' mainloop over the unit's k-blocks (an inactive consumer only releases the stages),
// then a writer piece's partials to the workspace, or the tile's epilogue (WriteForwardTile),
// after the other pieces' partials where the tile is split and, with a hand-over epilogue, once
// the activation warps have read the previous tile's staging, to which it then hands this one.
// Waits for its TMA writes before it returns.
template <bool kTransposeW, Epilogue kEpilogue, int kStages>
__device__ __forceinline__ void ConsumeForwardUnits(
    const CUtensorMap& y_map, bf16* y, const SplitWorkspace& split, const StageRing<kStages>& ring,
    const StageBarriers<kStages, kForwardCluster>& barriers, const ActivationBarriers& activation,
    const ClusterTileSchedule& schedule, const TailSplit& plan, const RoundRobin& units, int rank,
    int consumer, int n, int f) {
  constexpr int kStagingBytes = ForwardPipeline<kTransposeW, kEpilogue>::kStagingBytes;
  constexpr bool kHandOver = kEpilogue != Epilogue::kStore;
  uint8_t* const staging_generic = ring.Extra() + consumer * kStagingBytes;
  const uint32_t staging = SmemAddress(staging_generic);
  Accumulators acc;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  PipelineState<kStages> state;
  uint32_t read_phase = 0;
  bool read_pending = false;  // kHandOver: the activation warps may still read the staging
  for (int u = units.first; u < units.end; u += units.step) {
    const TileUnit unit = UniformUnit(plan.Find(u));
    const ClusterTile tile = UniformTile(schedule.Find(unit.tile));
    const ConsumerTile part(tile, rank, consumer, n);
    const auto a_descriptor = [&](int stage, int slice) {
      return KMajorDescriptor(ring.A(stage) + consumer * kBoxBytes, slice);
    };
    const auto b_descriptor = [&](int stage, int slice) {
      return kTransposeW ? KMajorDescriptor(ring.B(stage), slice)
                         : MNMajorDescriptor(ring.B(stage), slice);
    };
    MultiplyStages<0, kTransposeW ? 0 : 1>(acc, unit.k_end - unit.k_begin, part.active, barriers,
                                           state, a_descriptor, b_descriptor);
    if (!part.active) continue;
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
    WriteForwardTile<kEpilogue, kStagingBytes>(acc, y_map, y, staging_generic, staging, barrier,
                                               part, n, f);
    if constexpr (kHandOver) {
      MbarrierArrive(activation.Staged(consumer));
      read_pending = true;
    }
  }
  if (threadIdx.x % kWarpgroupThreads == 0) BulkWaitAll();
}

// y = x · op(w) per group (see grouped_gemm_sm90.cuh), in clusters of kForwardCluster CTAs.
// x_map: x as (k, rows), box (64, 64); w_map: w as (k, n, groups), box (64, 128, 1) when
// kTransposeW, else (n, k, groups), box (64, 64, 1); y_map: y as (n, rows, 1), box (64, 64, 1).
// split: the last wave's workspace (TailSplit; Epilogue::kStore only).
// Epilogue::kSwiglu (fc1 with SwiGLU: w's n = 2 f rows are [gate | up]; kTransposeW): also
// swiglu.act = silu(gate) * up * scale[row] (rows, f). A tile then holds 128 gate columns and their
// 128 up columns (the schedule's column c is gate column c / 2); y_map is y as (f, 2, rows) (the
// gate or up half as a dimension, clipped at f), box (64, 1, 64). Each consumer stages and writes
// y as usual and hands the staging to the activation warps (ActivationBarriers), which compute a
// from it (WriteActivation) during the consumer's next mainloop. (Computing a in the consumers'
// epilogue, staged and TMA-written after y, slowed fc1 about as much as the separate SwiGLU
// kernel it saved, or more.)
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
  // the split (their activation warps at their register limit) both were slower, also at a shape
  // where nothing split.
  constexpr bool kSplitsTail = kEpilogue == Epilogue::kStore;
  static_assert(!(kSplitsTail && kHandOver));
  const int total = WarpUniform(schedule.Total());
  const TailSplit plan = kSplitsTail ? TailSplit::Of(total, unit_step, k_blocks, split.slots)
                                     : TailSplit::Whole(total, k_blocks);
  const RoundRobin units{first_unit, unit_step, WarpUniform(plan.Units())};

  if (warpgroup == 0) {
    DecreaseMaxRegisters<ProducerRegisters(kEpilogue)>();
    if (threadIdx.x == 0) {
      ProduceForwardStages<kTransposeW, kSwiglu>(x_map, w_map, ring, barriers, schedule, plan,
                                                 units, rank, f);
    } else if (kHandOver && threadIdx.x >= kWarpgroupThreads - kActivationThreads) {
      RunActivationWarps<kSwiglu, kStagingBytes>(swiglu, ring, activation, schedule, units, rank,
                                                 rows, n, f);
    }
  } else {
    IncreaseMaxRegisters<ConsumerRegisters(kEpilogue)>();
    ConsumeForwardUnits<kTransposeW, kEpilogue>(y_map, y, split, ring, barriers, activation,
                                                schedule, plan, units, rank, warpgroup - 1, n, f);
  }
  // No CTA leaves while its peer may still release a stage in it (remote mbarrier arrivals).
  __syncwarp();
  ClusterSync();
#else
  __trap();
#endif
}

}  // namespace moe::cuda::sm90::detail
