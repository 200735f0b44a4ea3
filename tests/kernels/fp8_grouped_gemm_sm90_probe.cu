// Standalone probe of the Hopper FP8 grouped GEMM
// (engine/kernels/cuda/grouped_gemm/fp8_grouped_gemm_sm90.cuh) on an H100/H200: checks it against
// per-group cuBLAS f32 products of the dequantised operands and times it beside the bf16 grouped
// GEMM (GroupedMatmulSm90 with transpose_w) on the unquantised bf16 operands. Build and run from
// the repository root (one line; the filter, e.g. qwen3, runs only the cases whose name contains
// it):
// clang-format off
//   nvcc -O3 -std=c++20 -arch=sm_90a -I. tests/kernels/fp8_grouped_gemm_sm90_probe.cu -lcublas -o /tmp/fp8_probe && /tmp/fp8_probe [filter]
// clang-format on
// ctest runs its check mode over every case (PROBE_CHECKS_ONLY=1: no timing) as
// fp8_grouped_gemm_probe_cuda_test, label cuda (where the build has architecture 90).
//
// Cases: y (rows, n) = x (rows, k) · w_g^T per group; a tiny one (the first to debug), one with
// tails (k 1008: a partial last K tile; n 344: a partial last column block; groups of 0, 1, 37,
// 129 and 300 rows, empty first and last groups), and the MoE expert layers at 4096 tokens with
// random top-k routing: Qwen3-30B-A3B (128 experts, top 8: fc1 k 2048 n 1536, fc2 k 768 n 2048),
// Mixtral-8x7B (8, top 2: fc1 k 4096 n 28672, fc2 k 14336 n 4096), DeepSeek-V3-like (256, top 8:
// fc1 k 7168 n 4096, fc2 k 2048 n 7168).
// Operands: x and w uniform in [-1, 1) rounded to bf16 (the bf16 GEMM's operands), quantised here
// as the engine does (fp8_scaling.h: 1 x 128 tiles of x, 128 x 128 blocks of w, scale = max(amax,
// 2^-64) / 448, q = e4m3(v * 448 / max(amax, 2^-64)), satfinite, nearest even).
// Checks (PASS/FAIL each; exit status 1 if any fails or none ran, 2 on a CUDA error, 3 on a kernel
// that does not finish within 20 s, e.g. a pipeline deadlock), for y f32 and y bf16, against the
// f32 reference (per group: the dequantised w_g, then cublasSgemm of the group's dequantised
// rows), y and 64 guard rows after it poisoned first (all bytes 0xFF: NaN):
//   - every element finite and |ours - ref| <= tolerance * max|ref|: f32 y 2e-3, bf16 y 1e-2. The
//     tensor cores sum each 128-long K tile's products with about 14 bits kept (DeepSeek-V3), an
//     error below 2^-14 * 128 |product| per tile, about 1e-3 of a typical |ref| at most where
//     every tile errs the same way, and far less beside max|ref|; bf16 y adds its rounding (2^-9
//     of |ref|). A wrong row, tile, block or scale errs by a sizeable part of max|ref|;
//   - the guard rows keep their poison (no store past the last row).
// Timing (none with PROBE_CHECKS_ONLY=1, for compute-sanitizer): median of 10 (after one warm-up)
// by cudaEvent, in ms and TFLOP/s (2 rows n k): the FP8 kernel (y bf16) and the bf16 kernel.
#include <cublas_v2.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/kernels/cuda/grouped_gemm/fp8_grouped_gemm_sm90.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_sm90.cuh"

#include "tests/kernels/probe_harness.cuh"

namespace {

using moe::cuda::sm90::bf16;

constexpr int kTile = 128;  // the FP8 scaling's tile edge
constexpr int kGuardRows = 64;
constexpr double kF32Tolerance = 2e-3;
constexpr double kBf16Tolerance = 1e-2;

__global__ void FillUniform(bf16* out, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16(UniformFromHash(seed, i));
  }
}

// Quantises gridDim.y row-major (rows, cols) bf16 matrices in tiles of tile_rows x kTile (x: 1,
// w: kTile): one block of kTile threads per (tile, matrix), a thread per column; scales (matrix,
// row tile, column tile).
__global__ void QuantizeTiles(const bf16* x, int64_t rows, int64_t cols, int tile_rows, uint8_t* q,
                              float* scales) {
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows;
  const int64_t matrix = blockIdx.y, tile = blockIdx.x;
  const int64_t r0 = tile / col_tiles * tile_rows, r1 = min(rows, r0 + tile_rows);
  const int64_t c = tile % col_tiles * kTile + threadIdx.x;
  const int64_t base = matrix * rows * cols;
  float amax = 0.0f;
  if (c < cols) {
    for (int64_t r = r0; r < r1; ++r)
      amax = fmaxf(amax, fabsf(__bfloat162float(x[base + r * cols + c])));
  }
  __shared__ float maxima[kTile];
  maxima[threadIdx.x] = amax;
  __syncthreads();
  for (int stride = kTile / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      maxima[threadIdx.x] = fmaxf(maxima[threadIdx.x], maxima[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float a = fmaxf(maxima[0], 0x1p-64f);
  if (threadIdx.x == 0) scales[matrix * row_tiles * col_tiles + tile] = a / 448.0f;
  const float multiplier = 448.0f / a;
  if (c >= cols) return;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = base + r * cols + c;
    q[i] = __nv_cvt_float_to_fp8(__bfloat162float(x[i]) * multiplier, __NV_SATFINITE, __NV_E4M3);
  }
}

// out (rows, cols) f32 = e4m3 q * its tile's scale (tiles as QuantizeTiles', one matrix).
__global__ void Dequantize(const uint8_t* q, const float* scales, int64_t rows, int64_t cols,
                           int tile_rows, float* out) {
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3)));
    out[i] = v * scales[r / tile_rows * col_tiles + c / kTile];
  }
}

// ---------------------------------------------------------------- cases

struct Case {
  std::string name;
  int64_t k, n;
  std::vector<int32_t> rows_per_group;
};

// Rows per expert of `tokens` tokens each routed to top_k distinct random experts.
std::vector<int32_t> RandomRouting(int experts, int top_k, int tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> counts(experts, 0);
  std::vector<int> order(experts);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) order[e] = e;
    for (int j = 0; j < top_k; ++j) {
      const int pick = j + static_cast<int>(rng() % static_cast<uint32_t>(experts - j));
      std::swap(order[j], order[pick]);
      ++counts[order[j]];
    }
  }
  return counts;
}

struct Tally {
  int passed = 0, failed = 0;
  void Report(bool ok, const std::string& what, const std::string& detail) {
    std::printf("%s %s: %s\n", ok ? "PASS" : "FAIL", what.c_str(), detail.c_str());
    (ok ? passed : failed)++;
  }
};

template <typename Out>
float ToHostFloat(Out v) {
  if constexpr (std::is_same_v<Out, float>) {
    return v;
  } else {
    return __bfloat162float(v);
  }
}

// Runs the FP8 kernel into a poisoned y of type Out and checks it against ref (rows, n).
template <typename Out>
void CheckOutput(Tally& tally, const Case& c, const std::vector<float>& ref, const uint8_t* xq,
                 const float* x_scales, const uint8_t* wq, const float* w_scales,
                 const int32_t* offsets, int64_t rows) {
  const int groups = static_cast<int>(c.rows_per_group.size());
  const std::string what = c.name + (std::is_same_v<Out, float> ? " (y f32)" : " (y bf16)");
  const size_t total = static_cast<size_t>(rows + kGuardRows) * c.n;
  DeviceArray<Out> y(total);
  MOE_CHECK_CUDA(cudaMemset(y.data, 0xFF, total * sizeof(Out)));
  MOE_CHECK_CUDA(moe::cuda::sm90::Fp8GroupedMatmulSm90<Out>(
      xq, x_scales, wq, w_scales, offsets, groups, rows, c.n, c.k, y.data, nullptr));
  SyncOrTimeout(what.c_str());
  std::vector<Out> host(total);
  MOE_CHECK_CUDA(cudaMemcpy(host.data(), y.data, total * sizeof(Out), cudaMemcpyDeviceToHost));
  double max_ref = 0.0, max_error = 0.0;
  for (float v : ref) max_ref = std::max(max_ref, std::fabs(static_cast<double>(v)));
  size_t non_finite = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float v = ToHostFloat(host[i]);
    if (!std::isfinite(v)) {
      ++non_finite;
      continue;
    }
    const double error = std::fabs(static_cast<double>(v) - ref[i]);
    if (error > max_error) {
      max_error = error;
      worst = i;
    }
  }
  size_t guards_written = 0;
  const uint8_t* guard_bytes = reinterpret_cast<const uint8_t*>(host.data() + ref.size());
  for (size_t b = 0; b < static_cast<size_t>(kGuardRows) * c.n * sizeof(Out); ++b) {
    guards_written += guard_bytes[b] != 0xFF;
  }
  const double tolerance = std::is_same_v<Out, float> ? kF32Tolerance : kBf16Tolerance;
  const bool ok = non_finite == 0 && guards_written == 0 && max_error <= tolerance * max_ref;
  char detail[256];
  std::snprintf(detail, sizeof(detail),
                "max|err| %.3g = %.3g max|ref| (tolerance %.0e) at row %zu col %zu; %zu "
                "non-finite; %zu guard bytes written",
                max_error, max_ref > 0 ? max_error / max_ref : 0.0, tolerance, worst / c.n,
                worst % c.n, non_finite, guards_written);
  tally.Report(ok, what, detail);
}

void ProbeCase(Tally& tally, cublasHandle_t cublas, const Case& c) {
  const int groups = static_cast<int>(c.rows_per_group.size());
  std::vector<int32_t> offsets(groups + 1, 0);
  for (int g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + c.rows_per_group[g];
  const int64_t rows = offsets.back(), n = c.n, k = c.k;
  const int64_t k_tiles = (k + kTile - 1) / kTile, n_blocks = (n + kTile - 1) / kTile;
  std::printf("\n%s: rows %lld, groups %d, k %lld, n %lld\n", c.name.c_str(),
              static_cast<long long>(rows), groups, static_cast<long long>(k),
              static_cast<long long>(n));
  DeviceArray<bf16> x(rows * k), w(groups * n * k);
  DeviceArray<uint8_t> xq(rows * k), wq(groups * n * k);
  DeviceArray<float> x_scales(rows * k_tiles), w_scales(groups * n_blocks * k_tiles);
  DeviceArray<int32_t> device_offsets(groups + 1);
  MOE_CHECK_CUDA(cudaMemcpy(device_offsets.data, offsets.data(), offsets.size() * sizeof(int32_t),
                            cudaMemcpyHostToDevice));
  FillUniform<<<4096, 256>>>(x.data, x.count, 1);
  FillUniform<<<4096, 256>>>(w.data, w.count, 2);
  if (rows > 0) {
    QuantizeTiles<<<dim3(rows * k_tiles, 1), kTile>>>(x.data, rows, k, 1, xq.data, x_scales.data);
  }
  QuantizeTiles<<<dim3(n_blocks * k_tiles, groups), kTile>>>(w.data, n, k, kTile, wq.data,
                                                             w_scales.data);
  MOE_CHECK_CUDA(cudaGetLastError());

  // The reference: per group, its dequantised w_g and rows, one cublasSgemm (row-major y_g (rows_g,
  // n) = x_g w_g^T is column-major y_g^T = w_g^T' x_g^T').
  DeviceArray<float> x_dequantised(rows * k), w_dequantised(n * k), ref(rows * n);
  Dequantize<<<4096, 256>>>(xq.data, x_scales.data, rows, k, 1, x_dequantised.data);
  for (int g = 0; g < groups; ++g) {
    const int64_t rows_g = c.rows_per_group[g];
    if (rows_g == 0) continue;
    Dequantize<<<4096, 256>>>(wq.data + g * n * k, w_scales.data + g * n_blocks * k_tiles, n, k,
                              kTile, w_dequantised.data);
    MOE_CHECK_CUDA(cudaGetLastError());
    const float one = 1.0f, zero = 0.0f;
    MOE_CHECK_CUBLAS(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                 static_cast<int>(rows_g), static_cast<int>(k), &one,
                                 w_dequantised.data, static_cast<int>(k),
                                 x_dequantised.data + offsets[g] * k, static_cast<int>(k), &zero,
                                 ref.data + offsets[g] * n, static_cast<int>(n)));
  }
  SyncOrTimeout("reference");
  std::vector<float> host_ref(rows * n);
  MOE_CHECK_CUDA(cudaMemcpy(host_ref.data(), ref.data, host_ref.size() * sizeof(float),
                            cudaMemcpyDeviceToHost));
  CheckOutput<float>(tally, c, host_ref, xq.data, x_scales.data, wq.data, w_scales.data,
                     device_offsets.data, rows);
  CheckOutput<bf16>(tally, c, host_ref, xq.data, x_scales.data, wq.data, w_scales.data,
                    device_offsets.data, rows);
  if (ChecksOnly()) return;

  DeviceArray<bf16> y(rows * n);
  moe::cuda::sm90::SplitWorkspace split = {};
  MOE_CHECK_CUDA(moe::cuda::sm90::AllocateSplitWorkspace(0, &split));
  const double flops = 2.0 * rows * n * k;
  const double fp8_ms = MedianMs(
      [&] {
        MOE_CHECK_CUDA(moe::cuda::sm90::Fp8GroupedMatmulSm90<bf16>(
            xq.data, x_scales.data, wq.data, w_scales.data, device_offsets.data, groups, rows, n, k,
            y.data, nullptr));
      },
      "fp8 timing");
  const double bf16_ms = MedianMs(
      [&] {
        MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulSm90(
            x.data, w.data, device_offsets.data, groups, rows, n, k, true, y.data, split, nullptr));
      },
      "bf16 timing");
  MOE_CHECK_CUDA(cudaFree(split.partials));  // one allocation: flags lie after the partials
  std::printf("  fp8 (y bf16) %8.3f ms %7.1f TFLOP/s | bf16 %8.3f ms %7.1f TFLOP/s | %.2fx\n",
              fp8_ms, flops / fp8_ms * 1e-9, bf16_ms, flops / bf16_ms * 1e-9, bf16_ms / fp8_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  PrintSm90DeviceOrExit();
  cudaFuncAttributes attributes;
  MOE_CHECK_CUDA(
      cudaFuncGetAttributes(&attributes, moe::cuda::sm90::detail::Fp8GroupedMatmulKernel<bf16>));
  std::printf("fp8 kernel: %d registers, %zu bytes local, %d bytes of dynamic shared memory\n",
              attributes.numRegs, attributes.localSizeBytes, moe::cuda::sm90::kFp8SmemBytes);
  constexpr int kTokens = 4096;
  const std::vector<Case> cases = {
      {"tiny", 256, 256, {120, 80}},
      {"tails", 1008, 344, {0, 129, 37, 0, 300, 1, 0}},
      {"qwen3-30b-a3b fc1", 2048, 1536, RandomRouting(128, 8, kTokens, 1)},
      {"qwen3-30b-a3b fc2", 768, 2048, RandomRouting(128, 8, kTokens, 1)},
      {"mixtral-8x7b fc1", 4096, 28672, RandomRouting(8, 2, kTokens, 2)},
      {"mixtral-8x7b fc2", 14336, 4096, RandomRouting(8, 2, kTokens, 2)},
      {"deepseek-v3-like fc1", 7168, 4096, RandomRouting(256, 8, kTokens, 3)},
      {"deepseek-v3-like fc2", 2048, 7168, RandomRouting(256, 8, kTokens, 3)},
  };
  cublasHandle_t cublas;
  MOE_CHECK_CUBLAS(cublasCreate(&cublas));
  Tally tally;
  for (const Case& c : cases) {
    if (c.name.find(filter) == std::string::npos) continue;
    ProbeCase(tally, cublas, c);
  }
  MOE_CHECK_CUBLAS(cublasDestroy(cublas));
  std::printf("\n%d passed, %d failed\n", tally.passed, tally.failed);
  if (tally.passed + tally.failed == 0) {
    std::fprintf(stderr, "no case's name contains \"%s\": nothing checked\n", filter.c_str());
    return 1;
  }
  return tally.failed == 0 ? 0 : 1;
}
