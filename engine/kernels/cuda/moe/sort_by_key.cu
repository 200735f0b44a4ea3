// CUDA SortByKey (contract: engine/kernels/op_declarations.inc): a stable counting sort of keys
// (n) i32 in [0, num_keys), deterministic. The input is cut into `chunks` consecutive chunks.
//   1. Count: counts (num_keys, chunks) i32 = how many of each key every chunk holds (integer
//      atomics: the totals do not depend on the order they land in).
//   2. Scan: an exclusive scan of counts in (key, chunk) order turns each entry into the first
//      output position of that key within that chunk; offsets[key] is the (key, chunk 0) entry
//      and offsets[num_keys] = n. The scan is tile sums, a one-block scan of those, and a
//      per-tile scan starting from its tile's sum.
//   3. Scatter: one warp per chunk walks its keys 32 at a time in input order; lanes holding
//      equal keys (__match_any_sync) take consecutive positions in lane order and the lowest of
//      them advances the (key, chunk) cursor. Input order is kept within and across chunks. For
//      few keys and short chunks a warp first stages its keys and cursors on chip.
// Chunks hold about kChunkTarget keys, fewer chunks when num_keys is large so counts stays within
// kMaxCounters entries (~16 MiB). Keys out of range trap (MOE_DEVICE_CHECK).
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int64_t kChunkTarget = 256;
constexpr int64_t kMaxCounters = int64_t{1} << 22;
constexpr int kScanThreads = 1024;
// One block-wide scan per tile: the MoE router's 128 x 128 counters are 16 tiles scanned at once
// (in tiles of 8 x 1024 two blocks scanned 8 times each in turn, one after another).
constexpr int64_t kScanTile = kScanThreads;
// The scatter's warps a block, and where it stages keys and cursors (StagedScatterKernel).
constexpr int kScatterWarps = 8;
constexpr int kStagedMaxKeys = 256;
constexpr int kStagedKeysPerLane = kChunkTarget / 32;

__global__ void CountKernel(const int32_t* keys, int64_t n, int64_t num_keys, int64_t chunk_size,
                            int64_t chunks, int32_t* counts) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t key = keys[i];
    MOE_DEVICE_CHECK(key >= 0 && key < num_keys);
    atomicAdd(&counts[key * chunks + i / chunk_size], 1);
  }
}

// Exclusive prefix sum over the block of one value per thread; *total receives the block's sum.
// Every thread of the block must call it.
__device__ int32_t BlockExclusiveScan(int32_t value, int32_t* total) {
  __shared__ int32_t warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int32_t lower = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += lower;
  }
  __syncthreads();  // an earlier call's readers are done with warp_sums
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  const int32_t warp_sum = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0;
  int32_t warps_inclusive = warp_sum;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int32_t lower = __shfl_up_sync(0xffffffffu, warps_inclusive, offset);
    if (lane >= offset) warps_inclusive += lower;
  }
  *total = __shfl_sync(0xffffffffu, warps_inclusive, 31);
  const int32_t warp_start = __shfl_sync(0xffffffffu, warps_inclusive - warp_sum, warp);
  return warp_start + inclusive - value;
}

// tile_sums[b] = sum of in[b * kScanTile, (b + 1) * kScanTile).
__global__ void TileSumsKernel(const int32_t* in, int64_t size, int32_t* tile_sums) {
  const int64_t begin = int64_t{blockIdx.x} * kScanTile, end = std::min(size, begin + kScanTile);
  int32_t sum = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += in[i];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) tile_sums[blockIdx.x] = sum;
}

// Block b writes the exclusive scan of tile b (`tile` entries) of `in` to `out`, starting from
// tile_starts[b] (0 when null). out may alias in.
__global__ void ExclusiveScanKernel(const int32_t* in, int64_t size, int64_t tile,
                                    const int32_t* tile_starts, int32_t* out) {
  const int64_t begin = int64_t{blockIdx.x} * tile, end = std::min(size, begin + tile);
  int32_t carry = tile_starts != nullptr ? tile_starts[blockIdx.x] : 0;
  for (int64_t base = begin; base < end; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    int32_t total;
    const int32_t before = BlockExclusiveScan(i < end ? in[i] : 0, &total);
    if (i < end) out[i] = carry + before;
    carry += total;
  }
}

__global__ void OffsetsKernel(const int32_t* starts, int64_t num_keys, int64_t chunks, int64_t n,
                              int32_t* offsets) {
  for (int64_t key = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; key <= num_keys;
       key += int64_t{gridDim.x} * blockDim.x) {
    offsets[key] = key < num_keys ? starts[key * chunks] : static_cast<int32_t>(n);
  }
}

// One step of a warp's walk of its chunk: lane l places element i (key, if valid) at its
// key's cursor plus the number of lower lanes holding the same key; the lowest of them then
// advances the cursor past them all.
__device__ __forceinline__ void PlaceInOrder(int32_t key, bool valid, int64_t i, int32_t* cursor,
                                             int32_t* order) {
  const int lane = threadIdx.x % 32;
  const unsigned peers = __match_any_sync(0xffffffffu, valid ? key : -1);
  if (valid) order[*cursor + __popc(peers & ((1u << lane) - 1))] = static_cast<int32_t>(i);
  __syncwarp();  // every peer has read the cursor
  if (valid && lane == __ffs(peers) - 1) *cursor += __popc(peers);
  __syncwarp();  // the update is visible to the next step
}

// One warp per chunk; cursors (num_keys, chunks) start as the scanned counts.
__global__ void ScatterKernel(const int32_t* keys, int64_t n, int64_t chunk_size, int64_t chunks,
                              int32_t* cursors, int32_t* order) {
  const int lane = threadIdx.x % 32;
  const int64_t chunk = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  if (chunk >= chunks) return;  // the whole warp
  const int64_t end = std::min(n, (chunk + 1) * chunk_size);
  for (int64_t base = chunk * chunk_size; base < end; base += 32) {
    const int64_t i = base + lane;
    const bool valid = i < end;
    const int32_t key = valid ? keys[i] : 0;
    PlaceInOrder(key, valid, i, &cursors[int64_t{key} * chunks + chunk], order);
  }
}

// ScatterKernel where the keys are few (num_keys <= kStagedMaxKeys) and the chunks short
// (chunk_size <= 32 * kStagedKeysPerLane): each warp first loads its chunk's keys into
// registers and its cursors into shared memory, in one round of loads, so its walk then waits
// on no global load (ScatterKernel's every step waits on one).
__global__ void __launch_bounds__(32 * kScatterWarps)
    StagedScatterKernel(const int32_t* keys, int64_t n, int chunk_size, int64_t chunks,
                        int num_keys, const int32_t* starts, int32_t* order) {
  __shared__ int32_t staged[kScatterWarps][kStagedMaxKeys];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t chunk = int64_t{blockIdx.x} * kScatterWarps + warp;
  if (chunk >= chunks) return;  // the whole warp
  const int64_t begin = chunk * chunk_size, end = std::min(n, begin + chunk_size);
  int32_t key[kStagedKeysPerLane];
#pragma unroll
  for (int j = 0; j < kStagedKeysPerLane; ++j) {
    const int64_t i = begin + j * 32 + lane;
    key[j] = i < end ? keys[i] : 0;
  }
  for (int k = lane; k < num_keys; k += 32) staged[warp][k] = starts[int64_t{k} * chunks + chunk];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kStagedKeysPerLane; ++j) {
    if (begin + j * 32 >= end) break;  // the whole warp
    const int64_t i = begin + j * 32 + lane;
    PlaceInOrder(key[j], i < end, i, &staged[warp][key[j]], order);
  }
}

}  // namespace

void SortByKey(const Tensor& keys, int64_t num_keys, const Tensor& order, const Tensor& offsets) {
  const int64_t n = keys.numel();
  CHECK_LE(n, INT32_MAX) << "sort: positions must fit in i32";
  if (n == 0) {
    Fill(offsets, 0.0f);
    return;
  }
  const cudaStream_t stream = StreamOf(keys);
  const int64_t chunks = std::max<int64_t>(
      1, std::min((n + kChunkTarget - 1) / kChunkTarget, kMaxCounters / num_keys));
  const int64_t chunk_size = (n + chunks - 1) / chunks;
  const int64_t counters = num_keys * chunks;
  const int64_t tiles = (counters + kScanTile - 1) / kScanTile;
  Tensor counts = Tensor::Empty({counters}, DType::kI32, keys.device());
  Tensor tile_sums = Tensor::Empty({tiles}, DType::kI32, keys.device());
  int32_t* pcounts = Ptr<int32_t>(counts);
  int32_t* ptile_sums = Ptr<int32_t>(tile_sums);

  MOE_CUDA_CALL(cudaMemsetAsync(pcounts, 0, counts.nbytes(), stream));
  CountKernel<<<BlocksFor(n, 256), 256, 0, stream>>>(Ptr<const int32_t>(keys), n, num_keys,
                                                     chunk_size, chunks, pcounts);
  MOE_CUDA_CHECK_LAUNCH();
  TileSumsKernel<<<static_cast<int>(tiles), kScanThreads, 0, stream>>>(pcounts, counters,
                                                                       ptile_sums);
  MOE_CUDA_CHECK_LAUNCH();
  ExclusiveScanKernel<<<1, kScanThreads, 0, stream>>>(ptile_sums, tiles, tiles, nullptr,
                                                      ptile_sums);
  MOE_CUDA_CHECK_LAUNCH();
  ExclusiveScanKernel<<<static_cast<int>(tiles), kScanThreads, 0, stream>>>(
      pcounts, counters, kScanTile, ptile_sums, pcounts);
  MOE_CUDA_CHECK_LAUNCH();
  OffsetsKernel<<<BlocksFor(num_keys + 1, 256), 256, 0, stream>>>(pcounts, num_keys, chunks, n,
                                                                  Ptr<int32_t>(offsets));
  MOE_CUDA_CHECK_LAUNCH();
  const int scatter_blocks = static_cast<int>((chunks + kScatterWarps - 1) / kScatterWarps);
  if (num_keys <= kStagedMaxKeys && chunk_size <= 32 * kStagedKeysPerLane) {
    StagedScatterKernel<<<scatter_blocks, 32 * kScatterWarps, 0, stream>>>(
        Ptr<const int32_t>(keys), n, static_cast<int>(chunk_size), chunks,
        static_cast<int>(num_keys), pcounts, Ptr<int32_t>(order));
  } else {
    ScatterKernel<<<scatter_blocks, 32 * kScatterWarps, 0, stream>>>(
        Ptr<const int32_t>(keys), n, chunk_size, chunks, pcounts, Ptr<int32_t>(order));
  }
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
