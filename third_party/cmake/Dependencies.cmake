# Finds every external dependency. Required: Eigen, gflags, glog, GoogleTest, Threads.
# Optional: CUDA (nvcc + cuBLAS), NCCL, MPI. Sets MOE_WITH_CUDA / MOE_WITH_MPI.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(gflags REQUIRED)
find_package(glog REQUIRED)
find_package(GTest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

# MOE_CUDA says when the CUDA kernels are built: gpu (the default) when nvcc is found and a GPU is
# visible, so a first build on a machine without one compiles no kernel; nvcc whenever nvcc is
# found (CI, the test command: the kernels must keep compiling); off never.
set(MOE_CUDA gpu CACHE STRING "Build the CUDA kernels: gpu (nvcc and a visible GPU), nvcc, off")
set_property(CACHE MOE_CUDA PROPERTY STRINGS gpu nvcc off)
if(NOT MOE_CUDA MATCHES "^(gpu|nvcc|off)$")
  message(FATAL_ERROR "-DMOE_CUDA=${MOE_CUDA} must be gpu, nvcc or off")
endif()

include(CheckLanguage)
# CI machines keep nvcc in /usr/local/cuda without putting it on PATH.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
set(moe_cuda_wanted OFF)
if(MOE_CUDA STREQUAL "nvcc")
  set(moe_cuda_wanted ON)
elseif(MOE_CUDA STREQUAL "gpu")
  execute_process(COMMAND nvidia-smi -L OUTPUT_VARIABLE moe_gpu_list RESULT_VARIABLE moe_smi_rc
                  ERROR_QUIET)
  if(moe_smi_rc EQUAL 0 AND moe_gpu_list MATCHES "GPU [0-9]")
    set(moe_cuda_wanted ON)
  else()
    message(STATUS "moe: no GPU visible (nvidia-smi -L): CUDA kernels not built "
                   "(-DMOE_CUDA=nvcc builds them anyway)")
  endif()
endif()
if(moe_cuda_wanted)
  check_language(CUDA)
endif()
set(MOE_WITH_CUDA OFF)
if(moe_cuda_wanted AND CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag (nvcc has it since 12.0): tell it.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # Hopper (H100/H200). A plain variable, so it wins over the toolkit default in the cache.
  set(MOE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build for")
  set(CMAKE_CUDA_ARCHITECTURES ${MOE_CUDA_ARCHITECTURES})
  find_package(CUDAToolkit REQUIRED)
  find_package(NCCL REQUIRED)
  set(MOE_WITH_CUDA ON)
endif()

find_package(MPI COMPONENTS CXX)
set(MOE_WITH_MPI ${MPI_CXX_FOUND})

message(STATUS "moe: CUDA ${MOE_WITH_CUDA} (MOE_CUDA=${MOE_CUDA}) (arch ${CMAKE_CUDA_ARCHITECTURES}), MPI ${MOE_WITH_MPI}")
