// See sm90_device.h. Compiled with the sm_90a translation units, so MOE_SM90A_BUILD says whether
// the build has them.
#include "engine/kernels/cuda/sm90_device.h"

#include <map>
#include <mutex>

#include "engine/kernels/cuda/cuda_common.cuh"

#ifndef MOE_SM90A_BUILD
#define MOE_SM90A_BUILD 0
#endif

namespace moe::cuda {

bool Sm90aKernelsRunOn(int device_index) {
  if (!MOE_SM90A_BUILD) return false;
  static std::mutex mutex;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto [it, first] = known.try_emplace(device_index, false);
  if (first) {
    int major = 0, minor = 0;
    MOE_CUDA_CALL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
    MOE_CUDA_CALL(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index));
    it->second = major == 9 && minor == 0;
  }
  return it->second;
}

}  // namespace moe::cuda
