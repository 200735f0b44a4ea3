// What the standalone kernel probes (grouped_gemm_sm90_probe.cu, fp8_grouped_gemm_sm90_probe.cu)
// share: CUDA and cuBLAS error checks (exit 2), the environment flags, device arrays, hashed
// uniform values, a wait that gives up on a deadlocked kernel (exit 3 after kTimeoutSeconds), the
// median of timed runs, and the device check. Header-only, CUDA headers only, for one-file nvcc
// builds.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

#define MOE_CHECK_CUDA(call)                                             \
  do {                                                                   \
    const cudaError_t status_ = (call);                                  \
    if (status_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(status_));                         \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)

#define MOE_CHECK_CUBLAS(call)                                                         \
  do {                                                                                 \
    const cublasStatus_t status_ = (call);                                             \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                            \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(status_));                                         \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kTimedRuns = 10;
constexpr double kTimeoutSeconds = 20.0;

// Whether the environment sets `name` to 1.
bool EnvironmentFlag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "1";
}

// PROBE_CHECKS_ONLY=1 in the environment: no timing (under compute-sanitizer the timed runs would
// take minutes and outlast the timeout).
bool ChecksOnly() {
  static const bool checks_only = EnvironmentFlag("PROBE_CHECKS_ONLY");
  return checks_only;
}

template <typename T>
struct DeviceArray {
  T* data = nullptr;
  size_t count = 0;

  explicit DeviceArray(size_t n) : count(n) {
    MOE_CHECK_CUDA(cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

__device__ float UniformFromHash(uint64_t seed, size_t i) {  // in [-1, 1)
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Waits for the device, giving up (exit 3) after kTimeoutSeconds: a deadlocked pipeline must not
// hang the probe.
void SyncOrTimeout(const char* what) {
  cudaEvent_t done;
  MOE_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  MOE_CHECK_CUDA(cudaEventRecord(done));
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t status = cudaEventQuery(done);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) {
      std::fprintf(stderr, "FAIL %s: %s\n", what, cudaGetErrorString(status));
      std::exit(2);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kTimeoutSeconds) {
      std::fprintf(stderr, "FAIL %s: not finished after %.0f s (deadlock?)\n", what,
                   kTimeoutSeconds);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  MOE_CHECK_CUDA(cudaEventDestroy(done));
}

// Median of kTimedRuns runs of `run` (after one warm-up), in ms; NaN (nothing run) when
// ChecksOnly().
double MedianMs(const std::function<void()>& run, const char* what) {
  if (ChecksOnly()) return std::nan("");
  run();
  SyncOrTimeout(what);
  std::vector<cudaEvent_t> events(2 * kTimedRuns);
  for (cudaEvent_t& e : events) MOE_CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < kTimedRuns; ++i) {
    MOE_CHECK_CUDA(cudaEventRecord(events[2 * i]));
    run();
    MOE_CHECK_CUDA(cudaEventRecord(events[2 * i + 1]));
  }
  SyncOrTimeout(what);
  std::vector<double> ms(kTimedRuns);
  for (int i = 0; i < kTimedRuns; ++i) {
    float elapsed = 0;
    MOE_CHECK_CUDA(cudaEventElapsedTime(&elapsed, events[2 * i], events[2 * i + 1]));
    ms[i] = elapsed;
  }
  for (cudaEvent_t& e : events) MOE_CHECK_CUDA(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return (ms[kTimedRuns / 2 - 1] + ms[kTimedRuns / 2]) / 2;
}

// Prints device 0 and exits 2 unless it is an sm_90 GPU (the probes' kernels are sm_90a).
void PrintSm90DeviceOrExit() {
  cudaDeviceProp prop;
  MOE_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs, %.0f GiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  if (prop.major != 9) {
    std::fprintf(stderr, "needs an sm_90 GPU (H100/H200)\n");
    std::exit(2);
  }
}

}  // namespace
