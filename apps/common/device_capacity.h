// What of a device's memory a run may count on, and how the checks before a run say it.
// CUDA: not all of the GPU. The CUDA context and the libraries (cuBLAS, NCCL) hold some, and the
// caching allocator's cached blocks more, so kCudaHeadroomFraction of a GPU is kept. The CPU
// backend's "device" is the host's physical memory, all of it.
#pragma once

#include <cstddef>
#include <string>

#include "engine/core/device.h"

namespace moe {

inline constexpr double kCudaHeadroomFraction = 0.02;

// The bytes of `capacity_bytes` (the device's whole memory) a run's allocations can have.
double UsableBytes(const Device& device, size_t capacity_bytes);

// E.g. "cuda:0 has 139.8 GiB, of which runs can use 137.0 GiB (the rest: CUDA context, libraries,
// the allocator's cache)", or "cpu (physical memory) has 23.5 GiB".
std::string CapacityText(const Device& device, size_t capacity_bytes);

// bytes as "1.5 GiB", "512.0 MiB", ... (one decimal; B to EiB).
std::string Bytes(double bytes);

}  // namespace moe
