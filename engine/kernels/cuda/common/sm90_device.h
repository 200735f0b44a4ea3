// Whether the Hopper (sm_90a) kernels of this build run on a device. They are compiled for
// sm_90a only when the build has architecture 90 (engine/CMakeLists.txt defines MOE_SM90A_BUILD
// for their translation units), and sm_90a code runs on compute capability 9.0 alone.
#pragma once

namespace moe::cuda {

// True when the build has the sm_90a kernels and CUDA device `device_index` is compute
// capability 9.0. Asked of the driver once per device (callers ask at every launch).
bool Sm90aKernelsRunOn(int device_index);

}  // namespace moe::cuda
