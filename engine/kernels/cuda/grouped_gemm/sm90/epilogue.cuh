// The store epilogue of the Hopper grouped GEMMs (design: ../grouped_gemm_sm90.cuh): a consumer
// warpgroup's 64 x N accumulators (the bf16 kernels' 64 x 256, the FP8 kernels' 64 x 192 and 64 x
// 128)
// staged as TMA boxes in its shared memory and written by TMA (store, or reduce-add for dw +=), or
// for a group's last rows copied by the threads.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"

namespace moe::cuda::sm90 {

// Output TMA writes (store, or reduce-add for dw +=): each consumer stages its 64 x N result
// (element type Out) in its own shared memory, as TMA boxes of 64 rows x kWriteColumns<Out>
// columns (one 128-byte swizzle row per tile row: 32 f32 or 64 bf16), in rounds of as many columns
// as its staging holds, and issues their writes without waiting for them: they drain while it
// goes on. Before a round refills the staging it waits until the previous round's writes have
// read it.
//   - Forward (y, bf16): the whole result, one round, so a tile's writes drain during the next
//     tile's mainloop (3 stages instead of 4 make room); fc2's forward: one box, 4 rounds, beside
//     4 stages (ForwardPipeline). Written from registers (st.global per thread) instead, they
//     made the forward much slower than with no writes at all.
//   - Weight gradient (dw, f32 or bf16): 16 KiB, 4 f32 or 2 bf16 rounds, beside 4 stages. (The
//     whole bf16 result beside 3 stages was faster for dw = but slower for += and for f32.)
//   - FP8 forward (64 x 192, f32 or bf16): one box, 6 f32 or 3 bf16 rounds, beside 5 stages of
//     40 KiB (with 128-column tiles, two boxes beside 5 stages were slower than one beside 6);
//     stores from registers made it slower too.
//   - FP8 weight gradient (64 x 128): two boxes, 2 f32 rounds or 1 bf16, beside 5 stages (faster
//     than one box beside 6).
template <typename Out>
constexpr int kWriteColumns = kSwizzleRowBytes / sizeof(Out);
constexpr int kForwardStagingBytes = 64 * kBlockN * sizeof(bf16);  // per consumer: 32 KiB
constexpr int kWeightGradStagingBytes = 2 * kBoxBytes;             // per consumer: 16 KiB

namespace detail {

// The columns N of a warpgroup's 64 x N result held as kAccumulatorCount f32 a thread
// (FragmentPosition).
template <int kAccumulatorCount>
constexpr int kResultColumns = kAccumulatorCount* kWarpgroupThreads / 64;

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

// Accumulator columns [kColumns round, kColumns (round + 1)) of this warpgroup's 64 x N result
// as Out into `staging` (shared address), as TMA boxes of 64 rows x kWriteColumns<Out>.
template <typename Out, int kColumns, int kAccumulatorCount>
__device__ __forceinline__ void StageColumns(const float (&acc)[kAccumulatorCount],
                                             uint32_t staging, int round) {
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

// This warpgroup's 64 x N accumulators as Out, staged through its kStagingBytes of `staging`
// (shared address) in rounds of kStagedColumns<Out, kStagingBytes> columns: each round waits
// until the staging is free (AwaitStaging), stages its columns and calls written(round), which
// writes them out.
template <typename Out, int kStagingBytes, int kAccumulatorCount, typename Written>
__device__ __forceinline__ void StageRounds(const float (&acc)[kAccumulatorCount], uint32_t staging,
                                            int barrier_id, Written written) {
  constexpr int kRoundColumns = kStagedColumns<Out, kStagingBytes>;
  constexpr int kColumns = kResultColumns<kAccumulatorCount>;
  static_assert(kColumns % kRoundColumns == 0);
#pragma unroll
  for (int round = 0; round < kColumns / kRoundColumns; ++round) {
    AwaitStaging(barrier_id);  // also: every thread is done with the previous round
    StageColumns<Out, kRoundColumns>(acc, staging, round);
    written(round);
  }
}

// The weight gradients' output map (host): dw (groups, n, k) of Out as (k, n, groups), boxes of
// kWriteColumns<Out> columns x 64 rows of one group, for WriteTile.
template <typename Out>
cudaError_t EncodeWeightGradOutputMap(CUtensorMap* map, Out* dw, int64_t groups, int64_t n,
                                      int64_t k) {
  constexpr uint64_t kOutBytes = sizeof(Out);
  const uint64_t un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k);
  return EncodeTensorMap<3>(map,
                            std::is_same_v<Out, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                            dw, {uk, un, static_cast<uint64_t>(groups)},
                            {uk * kOutBytes, un * uk * kOutBytes}, {kWriteColumns<Out>, 64, 1});
}

// The tensor-map coordinates (innermost first) of an output box.
struct BoxOrigin {
  int c0, c1, c2;
};

// This warpgroup's 64 x N accumulators as Out written (or added with `accumulate`: TMA
// reduce-add) to out_map, the box of tile columns [c, c + kWriteColumns<Out>) at box_at(c) (a
// BoxOrigin), staged in rounds through its kStagingBytes of `staging` (shared address); TMA clips
// the boxes to the tensor. Thread 0 issues the writes.
template <typename Out, int kStagingBytes, int kAccumulatorCount, typename BoxAt>
__device__ __forceinline__ void WriteTile(const float (&acc)[kAccumulatorCount],
                                          const CUtensorMap& out_map, uint32_t staging,
                                          int barrier_id, bool accumulate, BoxAt box_at) {
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

// The byte offset in a staged tile (StageColumns) of row `row`'s 16-byte piece `piece` (8 bf16 or
// 4 f32 columns): box piece / 8, chunk piece % 8 of the row, swizzled.
__device__ __forceinline__ int StagedPieceOffset(int row, int piece) {
  constexpr int kPiecesPerBoxRow = kSwizzleRowBytes / 16;
  return piece / kPiecesPerBoxRow * kBoxBytes + row * kSwizzleRowBytes +
         ((piece % kPiecesPerBoxRow) ^ (row % 8)) * 16;
}

// This warpgroup's 64 x N accumulators as Out, rows r < valid_rows (< 64: a group's last rows,
// which the next group's follow, where TMA would write all 64): the 16 bytes of columns from tile
// column c of row r to piece_at(r, c) (an Out pointer, or nullptr: past the tensor's columns),
// staged through `staging` (kStagingBytes: in rounds of as many columns as it holds) and copied
// in 16-byte pieces.
template <typename Out, int kStagingBytes, int kAccumulatorCount, typename PieceAt>
__device__ __forceinline__ void WriteRows(const float (&acc)[kAccumulatorCount],
                                          const uint8_t* staging, int barrier_id, int valid_rows,
                                          PieceAt piece_at) {
  constexpr int kRoundColumns = kStagedColumns<Out, kStagingBytes>;
  constexpr int kPieceColumns = 16 / static_cast<int>(sizeof(Out));
  constexpr int kPiecesPerRow = kRoundColumns / kPieceColumns;
  StageRounds<Out, kStagingBytes>(acc, SmemAddress(staging), barrier_id, [&](int round) {
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
    for (int piece = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
         piece < valid_rows * kPiecesPerRow; piece += kWarpgroupThreads) {
      const int r = piece / kPiecesPerRow, c = piece % kPiecesPerRow;
      Out* const out = piece_at(r, round * kRoundColumns + kPieceColumns * c);
      if (out == nullptr) continue;
      *reinterpret_cast<uint4*>(out) =
          *reinterpret_cast<const uint4*>(staging + StagedPieceOffset(r, c));
    }
  });
}

// This warpgroup's 64 x N accumulators as Out into y (rows, n), its rows [first_row, first_row +
// valid_rows) from column `column`: TMA boxes (WriteTile; y_map: y as (n, rows, 1), clipped to n)
// when all 64 rows are valid, else copied by the threads (WriteRows: no store past the group's
// end). staging / staging_generic: the warpgroup's kStagingBytes as a shared and a generic address.
template <typename Out, int kStagingBytes, int kAccumulatorCount>
__device__ __forceinline__ void WriteOutputRows(const float (&acc)[kAccumulatorCount],
                                                const CUtensorMap& y_map, Out* y, uint32_t staging,
                                                const uint8_t* staging_generic, int barrier,
                                                int first_row, int column, int valid_rows, int n) {
  if (valid_rows == 64) {
    WriteTile<Out, kStagingBytes>(acc, y_map, staging, barrier, false, [&](int c) {
      return BoxOrigin{column + c, first_row, 0};
    });
  } else {
    WriteRows<Out, kStagingBytes>(acc, staging_generic, barrier, valid_rows, [&](int r, int c) {
      const int64_t row = first_row + r;
      return column + c < n ? y + row * n + column + c : nullptr;
    });
  }
}

}  // namespace detail

}  // namespace moe::cuda::sm90
