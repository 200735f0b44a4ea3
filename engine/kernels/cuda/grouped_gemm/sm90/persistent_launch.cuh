// Persistent cluster launches of the Hopper grouped GEMMs (design: ../grouped_gemm_sm90.cuh): as
// many clusters as can be resident, asked once per kernel and device (LaunchPersistent); and the
// launchers' size check. Apart from launch.cuh so that a launcher includes it without the other
// kernels.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"

namespace moe::cuda::sm90::detail {

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

// kKernel(args...) launched persistently as PersistentClusterLaunch says: the launch's error, else
// the first error after it.
template <auto kKernel, typename... Args>
cudaError_t LaunchPersistent(int smem_bytes, int cluster_size, int64_t tiles, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster;
  cudaError_t status =
      PersistentClusterLaunch<kKernel>(smem_bytes, cluster_size, tiles, stream, &config, &cluster);
  if (status != cudaSuccess) return status;
  status = cudaLaunchKernelEx(&config, kKernel, std::forward<Args>(args)...);
  return status != cudaSuccess ? status : cudaGetLastError();
}

}  // namespace moe::cuda::sm90::detail
