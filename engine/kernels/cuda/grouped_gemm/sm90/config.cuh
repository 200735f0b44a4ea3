// The Hopper grouped GEMMs' compile-time configuration (design: ../grouped_gemm_sm90.cuh): tile
// and stage sizes, cluster and warpgroup shapes, the register split between producer and
// consumers, and the byte sizes of shared-memory operands and their wgmma slices.
#pragma once

#include <cuda_bf16.h>

#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"

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

static_assert(kBlockK * 2 == kSwizzleRowBytes);
static_assert(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0 && kBoxBytes % 1024 == 0);
static_assert(kBlockM == 64 * kConsumers && kBlockN % 64 == 0 && kBlockN / 8 * 4 == kAccumulators);
// setmaxnreg moves registers between the warpgroups within what the CTA got at launch (168 a
// thread): .inc waits until others have released enough, so a larger sum deadlocks.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
static_assert(kProducerRegisters * kWarpgroupThreads +
                  kConsumerRegisters * kWarpgroupThreads * kConsumers <=
              kLaunchRegisters * kThreads);

}  // namespace moe::cuda::sm90
