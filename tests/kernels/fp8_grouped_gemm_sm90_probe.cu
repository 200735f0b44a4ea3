// Standalone probe of the Hopper FP8 grouped GEMMs
// (engine/kernels/cuda/grouped_gemm/fp8_grouped_gemm_sm90.cuh) on an H100/H200: checks them against
// per-group cuBLAS f32 products of the dequantised operands and times them beside the bf16 grouped
// GEMMs (GroupedMatmulSm90 with transpose_w; GroupedMatmulWeightGradSm90) on the unquantised bf16
// operands. Build and run from the repository root (one line; the filter, e.g. qwen3 or wgrad,
// runs only the cases whose name contains it):
// clang-format off
//   nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -I. tests/kernels/fp8_grouped_gemm_sm90_probe.cu -lcublas -o /tmp/fp8_probe && /tmp/fp8_probe [filter]
// clang-format on
// ctest runs its check mode over every case (PROBE_CHECKS_ONLY=1: no timing) as
// fp8_grouped_gemm_probe_cuda_test, label cuda (where the build has architecture 90).
//
// Forward cases: y (rows, n) = x (rows, k) · w_g^T per group; a tiny one (the first to debug), one
// with tails (k 1008: a partial last K tile; n 344: a partial last column block, tiles starting
// at both offsets into a scale block; groups of 0, 1, 37, 129 and 300 rows, empty first and last
// groups), a narrow one (n 120: one partial tile and scale block), and the MoE expert layers at
// 4096 tokens with random top-k routing: Qwen3-30B-A3B (128 experts, top 8: fc1 k 2048 n 1536, fc2
// k 768 n 2048), Mixtral-8x7B (8, top 2: fc1 k 4096 n 28672, fc2 k 14336 n 4096), DeepSeek-V3-like
// (256, top 8: fc1 k 7168 n 4096, fc2 k 2048 n 7168). Operands: x and w uniform in [-1, 1) rounded
// to bf16 (the bf16 GEMM's operands), quantised here as the engine does (fp8_scaling.h: 1 x 128
// tiles of x, 128 x 128 blocks of w, scale = max(amax, 2^-64) / 448, q = e4m3(v * 448 / max(amax,
// 2^-64)), satfinite, nearest even). Checks (PASS/FAIL each; exit status 1 if any fails or none
// ran, 2 on a CUDA error, 3 on a kernel that does not finish within 20 s, e.g. a pipeline
// deadlock), for y f32 and y bf16, against the f32 reference (per group: the dequantised w_g, then
// cublasSgemm of the group's dequantised rows), y and 64 guard rows after it poisoned first (all
// bytes 0xFF: NaN):
//   - every element finite and |ours - ref| <= tolerance * max|ref|: f32 y 2e-3, bf16 y 1e-2. The
//     tensor cores sum each 128-long K tile's products with about 14 bits kept (DeepSeek-V3), an
//     error below 2^-14 * 128 |product| per tile, about 1e-3 of a typical |ref| at most where
//     every tile errs the same way, and far less beside max|ref|; bf16 y adds its rounding (2^-9
//     of |ref|). A wrong row, tile, block or scale errs by a sizeable part of max|ref|;
//   - the guard rows keep their poison (no store past the last row).
// Weight-gradient cases ("wgrad ..."): dw_g (groups, n, k) = sum over parts of dy_p,g^T x_p,g
// (Fp8GroupedMatmulWeightGradSm90) on dy_p (rows_p, n) and x_p (rows_p, k) quantised here as
// QuantizeColumnTiles lays them out (transposed, each group from Fp8ColumnStart's token with zeros
// after it up to a multiple of 32 and NaN bytes in the other tokens, which no product may read;
// tiles of 128 tokens from each group's first, per column; scales in Fp8ColumnTileSlot's rows:
// fp8_scaling.h), from bf16 values uniform in [-1, 1) times 2^((row / 37) % 7 - 3) and
// 2^(column % 5 - 2), so that tiles and columns get different scales and a scale from the wrong
// slot, row or column errs by a factor of 2 or more. A tiny case; tails (n 336, k 1008: partial row
// and column tiles; groups of 0, 1, 127, 128, 129, 300, 96 and 37 rows, 818 in all; an empty first
// and last group; groups whose last 32-token slice ends in zeros, or at their last token); two
// parts; a group of 6 token tiles among small ones (one tile's stages wrap the unclustered
// kernel's ring of 5); tails and two parts again with over 8 token tiles a group on average (the
// clustered kernel; the others take the unclustered one: grouped_gemm_tiles.h's
// Fp8WeightGradUsesClusters); and the MoE shapes above (dw of the forward case's w, one part).
// Checks for dw f32 and
// bf16, = (dw and 64 guard rows of k poisoned) and += (onto random dw, the guard rows poisoned),
// against the f32 reference (per part and group cublasSgemm of the dequantised operands, summed; +=
// adds the initial dw): the forward's tolerances on max|expected|, every element finite, the guard
// rows untouched, and the groups without rows in any part exactly +0 (=) or bit-identical to what
// they held (+=). And "two parts
// == one part": where the parts' groups hold multiples of 128 rows (but the last), the two parts'
// dw equals bit for bit the dw of one part holding each group's rows of both (the same tiles,
// scales and order of promotions). Timing (none with PROBE_CHECKS_ONLY=1, for compute-sanitizer):
// median of 10 (after one warm-up) by cudaEvent, in ms and TFLOP/s (2 rows n k): the FP8 kernel (y
// bf16; dw f32 = and +=) and the bf16 kernel (the same output).
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
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/kernels/cuda/grouped_gemm/fp8_grouped_gemm_sm90.cuh"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_sm90.cuh"
#include "engine/kernels/fp8_scaling.h"

#include "tests/kernels/probe_harness.cuh"

namespace {

using moe::cuda::sm90::bf16;

constexpr int kTile = 128;  // the FP8 scaling's tile edge
constexpr int kGuardRows = 64;
constexpr double kF32Tolerance = 2e-3;
constexpr double kBf16Tolerance = 1e-2;

template <typename T>
__global__ void FillUniform(T* out, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<T>(UniformFromHash(seed, i));
  }
}

// out (rows, cols) bf16 = uniform in [-1, 1) * 2^((row / 37) % 7 - 3) * 2^(column % 5 - 2) (exact
// in bf16): the weight gradient's operands, whose tiles and columns then get different scales.
__global__ void FillScaledUniform(bf16* out, int64_t rows, int64_t cols, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const int exponent = static_cast<int>(r / 37 % 7) - 3 + static_cast<int>(c % 5) - 2;
    out[i] = __float2bfloat16(ldexpf(UniformFromHash(seed, i), exponent));
  }
}

__device__ float E4m3ToFloat(uint8_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
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
    out[i] = E4m3ToFloat(q[i]) * scales[r / tile_rows * col_tiles + c / kTile];
  }
}

// One 128-row tile of a group's rows, as QuantizeColumnTiles cuts them: rows [begin, end), its
// scales in row `slot`.
struct ColumnTile {
  int begin, end, slot, token;  // rows [begin, end) at q's tokens from `token`, then zeros
  int width;                    // up to token + width (a multiple of kFp8ColumnAlignment)
};

// The weight gradient's operand layout (ops::QuantizeColumnTiles): q (cols, stride) e4m3 = x
// (rows, cols) bf16 transposed, each tile's rows quantised per column with one scale, scales
// (slots, cols) f32 (the tile's row `slot`). Grid (tiles, ceil(cols / kTile)), kTile threads, one
// column each; q's other tokens and the unused scale rows are left as they are (the caller
// fills them with NaNs and zeros).
__global__ void QuantizeColumnTiles(const bf16* x, int64_t cols, const ColumnTile* tiles,
                                    int64_t stride, uint8_t* q, float* scales) {
  const ColumnTile tile = tiles[blockIdx.x];
  const int64_t c = blockIdx.y * int64_t{kTile} + threadIdx.x;
  if (c >= cols) return;
  float amax = 0.0f;
  for (int64_t r = tile.begin; r < tile.end; ++r) {
    amax = fmaxf(amax, fabsf(__bfloat162float(x[r * cols + c])));
  }
  const float a = fmaxf(amax, 0x1p-64f);
  scales[tile.slot * cols + c] = a / 448.0f;
  const float multiplier = 448.0f / a;
  for (int64_t i = 0; i < tile.width; ++i) {
    const int64_t r = tile.begin + i;
    q[c * stride + tile.token + i] =
        r < tile.end ? __nv_cvt_float_to_fp8(__bfloat162float(x[r * cols + c]) * multiplier,
                                             __NV_SATFINITE, __NV_E4M3)
                     : 0;
  }
}

// out (rows, cols) f32 = QuantizeColumnTiles' q (cols, stride) transposed times its scale;
// row_slots (rows): the scale row of each row's tile; row_tokens (rows): each row's token in q.
__global__ void DequantizeColumnTiles(const uint8_t* q, const float* scales,
                                      const int32_t* row_slots, const int32_t* row_tokens,
                                      int64_t rows, int64_t cols, int64_t stride, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = E4m3ToFloat(q[c * stride + row_tokens[r]]) * scales[row_slots[r] * cols + c];
  }
}

// A comparison of an output with what it should hold, over one block's elements (CompareOutput).
struct Deviation {
  double max_error, max_expected;
  unsigned long long worst, non_finite, empty_changed;
};

// The bits of an output element.
__device__ uint32_t Bits(float v) { return __float_as_uint(v); }
__device__ uint32_t Bits(bf16 v) { return __bfloat16_as_ushort(v); }

constexpr int kCompareThreads = 256;
constexpr int kCompareBlocks = 1024;

// Per block of kCompareBlocks: got (count) against expected = ref + initial (initial nullptr: 0),
// in double; and, where empty[i / group_elements], whether got differs from initial bit for bit
// (or from +0 without initial).
template <typename Out>
__global__ void CompareOutput(const Out* got, const float* ref, const Out* initial,
                              const uint8_t* empty, int64_t group_elements, int64_t count,
                              Deviation* blocks) {
  Deviation d = {};
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const Out before = initial != nullptr ? initial[i] : static_cast<Out>(0.0f);
    if (empty[i / group_elements] && Bits(got[i]) != Bits(before)) ++d.empty_changed;
    const double v = static_cast<float>(got[i]);
    const double expected = static_cast<double>(ref[i]) + static_cast<float>(before);
    d.max_expected = fmax(d.max_expected, fabs(expected));
    if (!isfinite(v)) {
      ++d.non_finite;
    } else if (fabs(v - expected) > d.max_error) {
      d.max_error = fabs(v - expected);
      d.worst = i;
    }
  }
  __shared__ Deviation all[kCompareThreads];
  all[threadIdx.x] = d;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int t = 1; t < kCompareThreads; ++t) {
    const Deviation& o = all[t];
    if (o.max_error > d.max_error) {
      d.max_error = o.max_error;
      d.worst = o.worst;
    }
    d.max_expected = fmax(d.max_expected, o.max_expected);
    d.non_finite += o.non_finite;
    d.empty_changed += o.empty_changed;
  }
  blocks[blockIdx.x] = d;
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

// ---------------------------------------------------------------- weight-gradient cases

using moe::cuda::sm90::Fp8WeightGradRows;

struct WeightGradCase {
  std::string name;
  int64_t n, k;                                 // dw (groups, n, k)
  std::vector<std::vector<int32_t>> part_rows;  // per part: rows per group
};

std::vector<int32_t> OffsetsOf(const std::vector<int32_t>& rows_per_group) {
  std::vector<int32_t> offsets(rows_per_group.size() + 1, 0);
  for (size_t g = 0; g < rows_per_group.size(); ++g) {
    offsets[g + 1] = offsets[g] + rows_per_group[g];
  }
  return offsets;
}

// One part of a weight gradient's rows on the device: dy (rows, n) and x (rows, k) bf16,
// QuantizeColumnTiles' forms of them (fp8_scaling.h's layout) and their dequantised values f32.
class WeightGradPart {
 public:
  WeightGradPart(const std::vector<int32_t>& rows_per_group, int64_t n, int64_t k)
      : n_(n),
        k_(k),
        offsets_(OffsetsOf(rows_per_group)),
        rows_(offsets_.back()),
        stride_(moe::Fp8ColumnTokens(groups(), rows_)),
        slots_(moe::Fp8ColumnTileSlots(groups(), rows_)),
        device_offsets_(offsets_.size()),
        dy_(rows_ * n),
        x_(rows_ * k),
        dy_q_(n * stride_),
        x_q_(k * stride_),
        dy_scales_(slots_ * n),
        x_scales_(slots_ * k),
        dy_f32_(rows_ * n),
        x_f32_(rows_ * k) {
    MOE_CHECK_CUDA(cudaMemcpy(device_offsets_.data, offsets_.data(),
                              offsets_.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }

  int groups() const { return static_cast<int>(offsets_.size()) - 1; }
  int32_t Rows(int g) const { return offsets_[g + 1] - offsets_[g]; }
  int64_t rows() const { return rows_; }

  // dy and x = FillScaledUniform's values from `seed`.
  void Fill(uint64_t seed) {
    FillScaledUniform<<<4096, 256>>>(dy_.data, rows_, n_, seed);
    FillScaledUniform<<<4096, 256>>>(x_.data, rows_, k_, seed + 1);
    MOE_CHECK_CUDA(cudaGetLastError());
  }

  // Each group's dy and x rows = `all`'s rows [skip[g], skip[g] + Rows(g)) of that group.
  void TakeRows(const WeightGradPart& all, const std::vector<int32_t>& skip) {
    for (int g = 0; g < groups(); ++g) {
      const int64_t from = all.offsets_[g] + skip[g], to = offsets_[g], count = Rows(g);
      MOE_CHECK_CUDA(cudaMemcpy(dy_.data + to * n_, all.dy_.data + from * n_,
                                count * n_ * sizeof(bf16), cudaMemcpyDeviceToDevice));
      MOE_CHECK_CUDA(cudaMemcpy(x_.data + to * k_, all.x_.data + from * k_,
                                count * k_ * sizeof(bf16), cudaMemcpyDeviceToDevice));
    }
  }

  // The quantised forms of dy and x, and their dequantised values.
  void Quantize() {
    std::vector<ColumnTile> tiles;
    std::vector<int32_t> row_slots(rows_), row_tokens(rows_);
    for (int g = 0; g < groups(); ++g) {
      for (int t = 0; t < moe::Fp8ColumnTileCount(offsets_[g], offsets_[g + 1]); ++t) {
        const moe::Fp8RowRange range = moe::Fp8ColumnTileRows(offsets_[g], offsets_[g + 1], t);
        const int begin = static_cast<int>(range.begin), end = static_cast<int>(range.end);
        const int slot = static_cast<int>(moe::Fp8ColumnTileSlot(g, offsets_[g], t));
        const int token = static_cast<int>(moe::Fp8ColumnToken(g, offsets_[g], begin));
        tiles.push_back(
            {begin, end, slot, token, static_cast<int>(moe::Fp8ColumnAligned(end - begin))});
        std::fill(row_slots.begin() + begin, row_slots.begin() + end, slot);
        for (int r = begin; r < end; ++r) row_tokens[r] = token + r - begin;
      }
    }
    // Tokens outside the groups' rows and their zeros: NaN (0xFF), which no product may read.
    MOE_CHECK_CUDA(cudaMemset(dy_q_.data, 0xFF, dy_q_.count));
    MOE_CHECK_CUDA(cudaMemset(x_q_.data, 0xFF, x_q_.count));
    MOE_CHECK_CUDA(cudaMemset(dy_scales_.data, 0, dy_scales_.count * sizeof(float)));
    MOE_CHECK_CUDA(cudaMemset(x_scales_.data, 0, x_scales_.count * sizeof(float)));
    if (tiles.empty()) return;
    DeviceArray<ColumnTile> device_tiles(tiles.size());
    DeviceArray<int32_t> device_slots(rows_), device_tokens(rows_);
    MOE_CHECK_CUDA(cudaMemcpy(device_tiles.data, tiles.data(), tiles.size() * sizeof(ColumnTile),
                              cudaMemcpyHostToDevice));
    MOE_CHECK_CUDA(cudaMemcpy(device_slots.data, row_slots.data(), rows_ * sizeof(int32_t),
                              cudaMemcpyHostToDevice));
    MOE_CHECK_CUDA(cudaMemcpy(device_tokens.data, row_tokens.data(), rows_ * sizeof(int32_t),
                              cudaMemcpyHostToDevice));
    const unsigned count = static_cast<unsigned>(tiles.size());
    QuantizeColumnTiles<<<dim3(count, (n_ + kTile - 1) / kTile), kTile>>>(
        dy_.data, n_, device_tiles.data, stride_, dy_q_.data, dy_scales_.data);
    QuantizeColumnTiles<<<dim3(count, (k_ + kTile - 1) / kTile), kTile>>>(
        x_.data, k_, device_tiles.data, stride_, x_q_.data, x_scales_.data);
    DequantizeColumnTiles<<<4096, 256>>>(dy_q_.data, dy_scales_.data, device_slots.data,
                                         device_tokens.data, rows_, n_, stride_, dy_f32_.data);
    DequantizeColumnTiles<<<4096, 256>>>(x_q_.data, x_scales_.data, device_slots.data,
                                         device_tokens.data, rows_, k_, stride_, x_f32_.data);
    MOE_CHECK_CUDA(cudaGetLastError());
    SyncOrTimeout("column-tile quantisation");
  }

  // ref (groups, n, k) += dy_g^T x_g of the dequantised operands, per group with rows: row-major
  // dw_g (n, k) is column-major (k, n) = x_g' (k, rows_g) · dy_g' (n, rows_g)^T.
  void AddReference(cublasHandle_t cublas, float* ref) const {
    const float one = 1.0f;
    for (int g = 0; g < groups(); ++g) {
      if (Rows(g) == 0) continue;
      MOE_CHECK_CUBLAS(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(k_),
                                   static_cast<int>(n_), Rows(g), &one,
                                   x_f32_.data + offsets_[g] * k_, static_cast<int>(k_),
                                   dy_f32_.data + offsets_[g] * n_, static_cast<int>(n_), &one,
                                   ref + g * n_ * k_, static_cast<int>(k_)));
    }
  }

  Fp8WeightGradRows Fp8() const {
    return {dy_q_.data,           dy_scales_.data, x_q_.data, x_scales_.data,
            device_offsets_.data, rows_,           stride_};
  }
  moe::cuda::sm90::WeightGradRows Bf16() const {
    return {dy_.data, x_.data, device_offsets_.data, rows_};
  }

 private:
  int64_t n_, k_;
  std::vector<int32_t> offsets_;
  int64_t rows_, stride_, slots_;
  DeviceArray<int32_t> device_offsets_;
  DeviceArray<bf16> dy_, x_;
  DeviceArray<uint8_t> dy_q_, x_q_;
  DeviceArray<float> dy_scales_, x_scales_, dy_f32_, x_f32_;
};

// Runs the FP8 weight gradient of `parts` into dw of type Out (=: poisoned; +=: random values)
// with 64 poisoned guard rows of k after it, and checks it against ref (groups, n, k) (+ the
// initial dw); empty (groups): the groups without rows in any part.
template <typename Out>
void CheckWeightGrad(Tally& tally, const std::string& name,
                     const std::vector<Fp8WeightGradRows>& parts, int groups, int64_t n, int64_t k,
                     bool accumulate, const float* ref, const uint8_t* empty) {
  const std::string what = name + (std::is_same_v<Out, float> ? " (dw f32 " : " (dw bf16 ") +
                           (accumulate ? "+=)" : "=)");
  const int64_t elements = groups * n * k, guard = kGuardRows * k;
  DeviceArray<Out> dw(elements + guard), initial(accumulate ? elements : 0);
  MOE_CHECK_CUDA(cudaMemset(dw.data, 0xFF, (elements + guard) * sizeof(Out)));
  if (accumulate) {
    FillUniform<<<4096, 256>>>(dw.data, elements, 99);
    MOE_CHECK_CUDA(cudaGetLastError());
    MOE_CHECK_CUDA(
        cudaMemcpy(initial.data, dw.data, elements * sizeof(Out), cudaMemcpyDeviceToDevice));
  }
  MOE_CHECK_CUDA(moe::cuda::sm90::Fp8GroupedMatmulWeightGradSm90<Out>(
      parts.data(), static_cast<int>(parts.size()), groups, n, k, accumulate, dw.data, nullptr));
  SyncOrTimeout(what.c_str());
  DeviceArray<Deviation> blocks(kCompareBlocks);
  CompareOutput<Out><<<kCompareBlocks, kCompareThreads>>>(
      dw.data, ref, accumulate ? initial.data : nullptr, empty, n * k, elements, blocks.data);
  MOE_CHECK_CUDA(cudaGetLastError());
  std::vector<Deviation> host(kCompareBlocks);
  MOE_CHECK_CUDA(cudaMemcpy(host.data(), blocks.data, kCompareBlocks * sizeof(Deviation),
                            cudaMemcpyDeviceToHost));
  Deviation d = {};
  for (const Deviation& b : host) {
    if (b.max_error > d.max_error) {
      d.max_error = b.max_error;
      d.worst = b.worst;
    }
    d.max_expected = std::max(d.max_expected, b.max_expected);
    d.non_finite += b.non_finite;
    d.empty_changed += b.empty_changed;
  }
  std::vector<uint8_t> guard_bytes(guard * sizeof(Out));
  MOE_CHECK_CUDA(cudaMemcpy(guard_bytes.data(), dw.data + elements, guard_bytes.size(),
                            cudaMemcpyDeviceToHost));
  const size_t guards_written =
      guard_bytes.size() - std::count(guard_bytes.begin(), guard_bytes.end(), uint8_t{0xFF});
  const double tolerance = std::is_same_v<Out, float> ? kF32Tolerance : kBf16Tolerance;
  const bool ok = d.non_finite == 0 && guards_written == 0 && d.empty_changed == 0 &&
                  d.max_error <= tolerance * d.max_expected;
  char detail[320];
  std::snprintf(detail, sizeof(detail),
                "max|err| %.3g = %.3g max|expected| (tolerance %.0e) at group %lld row %lld col "
                "%lld; %llu non-finite; %zu guard bytes written; %llu elements of empty groups "
                "changed",
                d.max_error, d.max_expected > 0 ? d.max_error / d.max_expected : 0.0, tolerance,
                static_cast<long long>(d.worst / (n * k)),
                static_cast<long long>(d.worst % (n * k) / k), static_cast<long long>(d.worst % k),
                d.non_finite, guards_written, d.empty_changed);
  tally.Report(ok, what, detail);
}

// With several parts: whether their dw (f32 =) equals bit for bit that of `all`, one part holding
// each group's rows of every part in order. Holds where every group of the parts has a multiple of
// 128 rows but the second part's last with rows (and there are two parts): the same 128-token
// windows, so the same tiles, scales and order of promotions.
void CheckPartsMatchOnePart(Tally& tally, const std::string& name,
                            const std::vector<Fp8WeightGradRows>& parts, const WeightGradPart& all,
                            int groups, int64_t n, int64_t k) {
  const std::string what = name + " (two parts == one part, dw f32 =)";
  const size_t elements = static_cast<size_t>(groups * n * k);
  DeviceArray<float> split(elements), whole(elements);
  const Fp8WeightGradRows one = all.Fp8();
  MOE_CHECK_CUDA(moe::cuda::sm90::Fp8GroupedMatmulWeightGradSm90<float>(
      parts.data(), static_cast<int>(parts.size()), groups, n, k, false, split.data, nullptr));
  MOE_CHECK_CUDA(moe::cuda::sm90::Fp8GroupedMatmulWeightGradSm90<float>(
      &one, 1, groups, n, k, false, whole.data, nullptr));
  SyncOrTimeout(what.c_str());
  std::vector<uint32_t> a(elements), b(elements);
  MOE_CHECK_CUDA(cudaMemcpy(a.data(), split.data, elements * 4, cudaMemcpyDeviceToHost));
  MOE_CHECK_CUDA(cudaMemcpy(b.data(), whole.data, elements * 4, cudaMemcpyDeviceToHost));
  size_t differ = 0, first = elements;
  for (size_t i = 0; i < elements; ++i) {
    if (a[i] != b[i] && differ++ == 0) first = i;
  }
  char detail[160];
  std::snprintf(detail, sizeof(detail), "%zu of %zu elements differ (first: element %zu)", differ,
                elements, first);
  tally.Report(differ == 0, what, detail);
}

void ProbeWeightGradCase(Tally& tally, cublasHandle_t cublas, const WeightGradCase& c) {
  const int groups = static_cast<int>(c.part_rows.front().size());
  const int64_t n = c.n, k = c.k, elements = groups * n * k;
  // all: each group's rows of every part in order; the parts take their rows from it.
  std::vector<int32_t> all_rows(groups, 0);
  for (const std::vector<int32_t>& rows : c.part_rows) {
    for (int g = 0; g < groups; ++g) all_rows[g] += rows[g];
  }
  WeightGradPart all(all_rows, n, k);
  all.Fill(10);
  all.Quantize();
  std::printf("\n%s: %zu part(s), rows %lld, groups %d, n %lld, k %lld\n", c.name.c_str(),
              c.part_rows.size(), static_cast<long long>(all.rows()), groups,
              static_cast<long long>(n), static_cast<long long>(k));
  std::vector<std::unique_ptr<WeightGradPart>> split;
  std::vector<int32_t> skip(groups, 0);
  for (const std::vector<int32_t>& rows : c.part_rows) {
    if (c.part_rows.size() == 1) break;  // the part is `all`
    split.push_back(std::make_unique<WeightGradPart>(rows, n, k));
    split.back()->TakeRows(all, skip);
    split.back()->Quantize();
    for (int g = 0; g < groups; ++g) skip[g] += rows[g];
  }
  std::vector<Fp8WeightGradRows> parts;
  DeviceArray<float> ref(elements);
  MOE_CHECK_CUDA(cudaMemset(ref.data, 0, elements * sizeof(float)));
  if (split.empty()) {
    parts.push_back(all.Fp8());
    all.AddReference(cublas, ref.data);
  }
  for (const std::unique_ptr<WeightGradPart>& part : split) {
    parts.push_back(part->Fp8());
    part->AddReference(cublas, ref.data);
  }
  SyncOrTimeout("reference");
  std::vector<uint8_t> empty(groups);
  for (int g = 0; g < groups; ++g) empty[g] = all.Rows(g) == 0;
  DeviceArray<uint8_t> device_empty(groups);
  MOE_CHECK_CUDA(cudaMemcpy(device_empty.data, empty.data(), groups, cudaMemcpyHostToDevice));
  for (const bool accumulate : {false, true}) {
    CheckWeightGrad<float>(tally, c.name, parts, groups, n, k, accumulate, ref.data,
                           device_empty.data);
    CheckWeightGrad<bf16>(tally, c.name, parts, groups, n, k, accumulate, ref.data,
                          device_empty.data);
  }
  if (!split.empty()) {
    CheckPartsMatchOnePart(tally, c.name, parts, all, groups, n, k);
    return;
  }
  if (ChecksOnly()) return;

  DeviceArray<float> dw(elements);
  MOE_CHECK_CUDA(cudaMemset(dw.data, 0, elements * sizeof(float)));
  const Fp8WeightGradRows fp8 = all.Fp8();
  const moe::cuda::sm90::WeightGradRows bf16_rows = all.Bf16();
  const double flops = 2.0 * all.rows() * n * k;
  for (const bool accumulate : {false, true}) {
    const double fp8_ms = MedianMs(
        [&] {
          MOE_CHECK_CUDA(moe::cuda::sm90::Fp8GroupedMatmulWeightGradSm90<float>(
              &fp8, 1, groups, n, k, accumulate, dw.data, nullptr));
        },
        "fp8 weight-gradient timing");
    const double bf16_ms = MedianMs(
        [&] {
          MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulWeightGradSm90<float>(
              &bf16_rows, 1, groups, n, k, accumulate, dw.data, nullptr));
        },
        "bf16 weight-gradient timing");
    std::printf("  fp8 (dw f32 %s) %8.3f ms %7.1f TFLOP/s | bf16 %8.3f ms %7.1f TFLOP/s | %.2fx\n",
                accumulate ? "+=" : "= ", fp8_ms, flops / fp8_ms * 1e-9, bf16_ms,
                flops / bf16_ms * 1e-9, bf16_ms / fp8_ms);
  }
}

}  // namespace

// A weight-gradient kernel (dw f32): its registers, local bytes (spills) and shared memory.
void PrintWeightGradKernel(const char* name, const void* kernel, int smem_bytes) {
  cudaFuncAttributes attributes;
  MOE_CHECK_CUDA(cudaFuncGetAttributes(&attributes, kernel));
  std::printf(
      "fp8 weight-gradient kernel, %s: %d registers, %zu bytes local, %d bytes of dynamic shared "
      "memory\n",
      name, attributes.numRegs, attributes.localSizeBytes, smem_bytes);
}

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  PrintSm90DeviceOrExit();
  cudaFuncAttributes attributes;
  MOE_CHECK_CUDA(
      cudaFuncGetAttributes(&attributes, moe::cuda::sm90::detail::Fp8GroupedMatmulKernel<bf16>));
  std::printf("fp8 kernel: %d registers, %zu bytes local, %d bytes of dynamic shared memory\n",
              attributes.numRegs, attributes.localSizeBytes, moe::cuda::sm90::kFp8SmemBytes);
  PrintWeightGradKernel(
      "unclustered",
      reinterpret_cast<const void*>(moe::cuda::sm90::detail::Fp8GroupedWeightGradKernel<float>),
      moe::cuda::sm90::kFp8WeightGradSmemBytes);
  PrintWeightGradKernel("clustered",
                        reinterpret_cast<const void*>(
                            moe::cuda::sm90::detail::Fp8GroupedWeightGradClusterKernel<float>),
                        moe::cuda::sm90::kFp8ClusterWeightGradSmemBytes);
  constexpr int kTokens = 4096;
  const std::vector<Case> cases = {
      {"tiny", 256, 256, {120, 80}},
      {"tails", 1008, 344, {0, 129, 37, 0, 300, 1, 0}},
      {"narrow", 384, 120, {70, 0, 200}},
      {"qwen3-30b-a3b fc1", 2048, 1536, RandomRouting(128, 8, kTokens, 1)},
      {"qwen3-30b-a3b fc2", 768, 2048, RandomRouting(128, 8, kTokens, 1)},
      {"mixtral-8x7b fc1", 4096, 28672, RandomRouting(8, 2, kTokens, 2)},
      {"mixtral-8x7b fc2", 14336, 4096, RandomRouting(8, 2, kTokens, 2)},
      {"deepseek-v3-like fc1", 7168, 4096, RandomRouting(256, 8, kTokens, 3)},
      {"deepseek-v3-like fc2", 2048, 7168, RandomRouting(256, 8, kTokens, 3)},
  };
  // dw (groups, n, k) of the forward's w; the two parts hold multiples of 128 rows per group but
  // the last group of the second, which ends off a multiple of 16 (padded tokens), so that one
  // part holding both has the same 128-token windows (CheckPartsMatchOnePart).
  std::vector<WeightGradCase> weight_grad_cases = {
      {"wgrad tiny", 128, 128, {{100, 60}}},
      {"wgrad tails", 336, 1008, {{0, 1, 127, 128, 129, 300, 96, 37, 0}}},
      {"wgrad two parts",
       336,
       1008,
       {{0, 128, 0, 256, 128, 0, 128, 0}, {0, 128, 128, 0, 256, 0, 37, 0}}},
      // A group of 6 token tiles: each of its tiles' stages wrap the unclustered kernel's ring.
      {"wgrad ring wraps", 336, 1008, {{700, 0, 37, 129}}},
      // Over 8 token tiles a group on average: the clustered kernel (the cases above take the
      // unclustered one).
      {"wgrad clustered tails", 336, 1008, {{1300, 0, 2500, 1, 1500, 1129}}},
      {"wgrad clustered two parts",
       336,
       1008,
       {{0, 1280, 0, 1408, 1280}, {1280, 1280, 0, 1280, 37}}},
  };
  // The MoE shapes' weight gradients; DeepSeek-like's only on a device of more than 100 GiB: its
  // dw (256 x 4096 x 7168) is 30 GB in f32, and with its reference and the += case's copy it
  // outgrows an 80 GB H100 (said in the output, and the tally counts fewer checks).
  size_t free_bytes = 0, total_bytes = 0;
  MOE_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const bool large_device = total_bytes > (size_t{100} << 30);
  for (const Case& c : cases) {
    if (c.name.rfind("deepseek", 0) == 0 && !large_device) {
      std::printf("wgrad %s: not run (needs more than this device's %zu GiB)\n", c.name.c_str(),
                  total_bytes >> 30);
      continue;
    }
    if (c.name.find(" fc") != std::string::npos) {
      weight_grad_cases.push_back({"wgrad " + c.name, c.n, c.k, {c.rows_per_group}});
    }
  }
  cublasHandle_t cublas;
  MOE_CHECK_CUBLAS(cublasCreate(&cublas));
  Tally tally;
  for (const Case& c : cases) {
    if (c.name.find(filter) == std::string::npos) continue;
    ProbeCase(tally, cublas, c);
  }
  for (const WeightGradCase& c : weight_grad_cases) {
    if (c.name.find(filter) == std::string::npos) continue;
    ProbeWeightGradCase(tally, cublas, c);
  }
  MOE_CHECK_CUBLAS(cublasDestroy(cublas));
  std::printf("\n%d passed, %d failed\n", tally.passed, tally.failed);
  if (tally.passed + tally.failed == 0) {
    std::fprintf(stderr, "no case's name contains \"%s\": nothing checked\n", filter.c_str());
    return 1;
  }
  return tally.failed == 0 ? 0 : 1;
}
