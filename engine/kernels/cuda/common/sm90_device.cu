// See sm90_device.h. Compiled with the sm_90a translation units, so MOE_SM90A_BUILD says whether
// the build has them.
#include "engine/kernels/cuda/common/sm90_device.h"

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/common/per_device.h"

#ifndef MOE_SM90A_BUILD
#define MOE_SM90A_BUILD 0
#endif

namespace moe::cuda {

bool Sm90aKernelsRunOn(int device_index) {
  if (!MOE_SM90A_BUILD) return false;
  return OncePerDevice<bool>(device_index, [&](bool& runs) {
    int major = 0, minor = 0;
    MOE_CUDA_CALL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
    MOE_CUDA_CALL(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index));
    runs = major == 9 && minor == 0;
  });
}

}  // namespace moe::cuda
