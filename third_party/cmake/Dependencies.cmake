# Finds every external dependency. Required: Eigen, gflags, glog, GoogleTest, Threads.
# Optional: CUDA (nvcc + cuBLAS), NCCL, MPI. Sets MOE_WITH_CUDA / MOE_WITH_MPI.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(gflags REQUIRED)
find_package(glog REQUIRED)
find_package(GTest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

include(CheckLanguage)
# CI machines keep nvcc in /usr/local/cuda without putting it on PATH.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
set(MOE_WITH_CUDA OFF)
if(CMAKE_CUDA_COMPILER AND NOT MOE_DISABLE_CUDA)
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

message(STATUS "moe: CUDA ${MOE_WITH_CUDA} (arch ${CMAKE_CUDA_ARCHITECTURES}), MPI ${MOE_WITH_MPI}")
