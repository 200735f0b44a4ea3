// Standalone probe of the Hopper grouped GEMMs
// (engine/kernels/cuda/grouped_gemm/grouped_gemm_sm90.cuh) on an H100/H200: checks each kernel
// against per-group cublasGemmEx references and times it beside cuBLAS. Build and run from the
// repository root (one line; the filter, e.g. qwen3, runs only the cases whose name contains it):
// clang-format off
//   nvcc -O3 -std=c++20 -arch=sm_90a -I. tests/kernels/grouped_gemm_sm90_probe.cu -lcublas -o /tmp/gg_probe && /tmp/gg_probe [filter]
// clang-format on
// ctest runs its check mode over every case (PROBE_CHECKS_ONLY=1, below) as
// grouped_gemm_probe_cuda_test, label cuda (tests/CMakeLists.txt builds it where the build has
// architecture 90).
//
// Cases: a tiny one (k 64 or 128, about one 128 x 256 tile per group: the first to debug), a
// tiny one whose groups end in tiles of at most 64 rows (the forward's epilogue paths), MoE
// expert layers of three models at 4096 tokens with random top-k routing (Qwen3-30B-A3B with one
// expert left empty, the same with every row on one expert, Mixtral, DeepSeek-V3-like), Mixtral
// with 1024, 1088 and 1152 rows on every expert (what a partly filled last row tile costs), the
// DeepSeek-V3-like shape with 512, 576 and 640, a small shape whose sizes are no multiples of the
// tiles (rows, k, n tails; fully out-of-bounds TMA boxes), and one whose plain products split
// their last tiles along k (on 132 SMs).
// Operations per case, with hidden h, expert ffn f, rows = tokens * top-k:
//   fc1 forward   y (rows, 2f) = x (rows, h) · w1_g^T,  w1 (E, 2f, h)   transpose_w
//   fc1 + SwiGLU  the same y, and a (rows, f) = silu(gate) * up * scale[row] of y's halves
//   fc2 forward   y (rows, h)  = a (rows, f) · w2_g^T,  w2 (E, h, f)    transpose_w
//   fc1 dgrad     dx (rows, h) = dy (rows, 2f) · w1_g                   no transpose
//   fc2 dgrad     da (rows, f) = dy (rows, h) · w2_g                    no transpose
//   fc2 dgrad + SwiGLU bwd  the same da (not stored), dh (rows, 2f) = [dgate | dup] of
//                 silu(gate) * up * scale[row] at h (rows, 2f) = [gate | up], dscale (rows)
//   fc1 wgrad     dw1 (E, 2f, h) = or += dy^T · x   (TMA store and TMA reduce-add epilogues)
//   fc2 wgrad     dw2 (E, h, f) = or += dy^T · a    (each with an f32 dw, then with a bf16 dw)
//                 each wgrad also over the rows cut into three parts (micro-batches) at rows off
//                 the 64-row K step, their offsets shifted and clamped: the same sum
// Checks (PASS/FAIL each; exit status 1 if any fails or none ran, 2 on a CUDA error, 3 on a kernel
// that does not finish within 20 s, e.g. a pipeline deadlock), against an f32 reference (the
// per-group cuBLAS products; for +=, plus the initial dw values as dw holds them):
//   - no non-finite values (y, and dw for =, start as NaN: an unwritten element fails), and every
//     |ours - ref| within: bf16 y 1e-2 max|ref|; f32 dw 1e-3 max|ref|; bf16 dw one bf16 ulp of
//     |ref| plus 2^-16 max|ref| per 16384 rows of the largest group (f32 summation-order noise
//     where a sum cancels, which grows with the sum's length) -- for += one ulp
//     of |ref| + 1, as the product is rounded to bf16 before L2 adds it to the initial value
//     (|initial| < 1), so where the sum cancels the error is up to half an ulp of the product;
//   - forward: 256 guard rows after y keep their sentinel (no store past the last group);
//   - fc1 + SwiGLU: a bit-identical to the SwiGLU formula (swiglu_math.cuh) applied to our y, and
//     guard rows after y and a;
//   - fc2 dgrad + SwiGLU bwd (dh and dscale start as NaN): dh bit-identical to the SwiGLU gradient
//     formula (swiglu_math.cuh) applied to our fc2 dgrad's da (checked by fc2 dgrad), also with
//     scale and dscale nullptr (against scale 1); dscale within 1e-4 max|ref| + 1e-6 of the row
//     sums (in double) of the formula's products (f32 summation-order noise); guard rows after dh;
//   - wgrad =: every empty group's dw_g ends as zeros; wgrad +=: every empty group's dw_g is
//     bit-identical to its initial values.
// PROBE_OURS_ONLY=1 in the environment times only our kernels (no cuBLAS baselines).
// PROBE_NO_SPLIT=1 in the environment gives the plain products no workspace: every tile whole.
// PROBE_TOKENS=N in the environment runs the three models' cases at N tokens instead of 4096
// (e.g. 16384, where each expert of the DeepSeek-V3-like shape has about four row tiles).
// PROBE_ROUTING=model:r0,r1,... (model qwen3-30b-a3b, mixtral-8x7b or deepseek-v3-like; one row
// count per expert, e.g. a moe_bench JSON row's rows_per_expert) adds a case of that model with
// exactly that routing.
// Timing (none with PROBE_CHECKS_ONLY=1, for compute-sanitizer): median of 10 (after one
// warm-up) by cudaEvent, in ms and TFLOP/s (2 rows n k): ours (wgrad: each dw type and
// epilogue; a fused SwiGLU: also the GEMM alone), per-group cublasGemmEx (the plain products: what
// the unfused path runs), cublasGemmGroupedBatchedEx bf16 (for wgrad bf16 out, as it has no bf16
// -> f32 form), the engine's cuBLAS wgrad path (widen to f32, TF32 grouped GEMM), and one dense
// cublasGemmEx of the same FLOPs (one weight matrix: far less weight or dw traffic than the
// grouped problem).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_sm90.cuh"

#include "tests/kernels/probe_harness.cuh"

namespace {

using moe::cuda::sm90::bf16;

constexpr int kGuardRows = 256;
constexpr double kBf16Tolerance = 1e-2;
constexpr double kF32Tolerance = 1e-3;
constexpr double kBf16DwFloor = 0x1p-16;    // of max|ref| per kBf16DwFloorRows, beside 1 ulp
constexpr double kBf16DwFloorRows = 16384;  // (at least one such floor)
constexpr double kDscaleTolerance = 1e-4;   // of max|ref|, beside kDscaleFloor
constexpr float kDscaleFloor = 1e-6f;       // absolute
constexpr float kInitialMagnitude = 1.0f;   // FillUniform's values lie in [-1, 1)
constexpr uint16_t kSentinelBits = 0x7FC1;  // a bf16 NaN

// The models' token count: PROBE_TOKENS, else 4096.
int ModelTokens() {
  const char* value = std::getenv("PROBE_TOKENS");
  if (value == nullptr) return 4096;
  const int tokens = std::atoi(value);
  if (tokens < 1 || tokens > 65536) {
    std::fprintf(stderr, "PROBE_TOKENS must be 1..65536, not %s\n", value);
    std::exit(2);
  }
  return tokens;
}

// ---------------------------------------------------------------- device helpers

__device__ float ToFloat(float v) { return v; }
__device__ float ToFloat(bf16 v) { return __bfloat162float(v); }

template <typename T>
__device__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __float2bfloat16(v);
  }
}

// out = uniform values of `seed` (bf16: rounded to nearest).
template <typename T>
__global__ void FillUniform(T* out, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(UniformFromHash(seed, i));
  }
}

template <typename T>
__global__ void AddInto(const T* in, float* out, size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] += ToFloat(in[i]);
  }
}

__global__ void FillBits(uint16_t* out, size_t count, uint16_t bits) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = bits;
  }
}

__global__ void Widen(const bf16* in, float* out, size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}

struct ErrorStats {
  unsigned int max_error_bits;      // max |ours - ref| as float bits (non-negative: ordered)
  unsigned int max_reference_bits;  // max |ref|
  unsigned long long non_finite;    // elements where ours or ref is NaN or Inf
};

template <typename Ours, typename Ref>
__global__ void Compare(const Ours* ours, const Ref* reference, size_t count, ErrorStats* stats) {
  float max_error = 0.0f, max_reference = 0.0f;
  unsigned long long non_finite = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const float a = ToFloat(ours[i]), b = ToFloat(reference[i]);
    if (!isfinite(a) || !isfinite(b)) {
      ++non_finite;
    } else {
      max_error = fmaxf(max_error, fabsf(a - b));
      max_reference = fmaxf(max_reference, fabsf(b));
    }
  }
  for (int d = 16; d > 0; d /= 2) {
    max_error = fmaxf(max_error, __shfl_xor_sync(0xffffffffu, max_error, d));
    max_reference = fmaxf(max_reference, __shfl_xor_sync(0xffffffffu, max_reference, d));
    non_finite += __shfl_xor_sync(0xffffffffu, non_finite, d);
  }
  if (threadIdx.x % 32 == 0) {
    atomicMax(&stats->max_error_bits, __float_as_uint(max_error));
    atomicMax(&stats->max_reference_bits, __float_as_uint(max_reference));
    atomicAdd(&stats->non_finite, non_finite);
  }
}

// What CheckClose accepts at every element: |ours - ref| <= of_max_reference max|ref| + absolute,
// plus (when bf16_ulp) one bf16 ulp of |ref| + ulp_margin.
struct Tolerance {
  double of_max_reference;
  bool bf16_ulp = false;
  float ulp_margin = 0.0f;
  float absolute = 0.0f;

  __device__ float Limit(float ref, float max_reference) const {
    const float limit = static_cast<float>(of_max_reference) * max_reference + absolute;
    if (!bf16_ulp) return limit;
    // 2^e for a magnitude in [2^e, 2^(e + 1)) (0 below the normal range); bf16 keeps 8 bits.
    const float binade = __uint_as_float(__float_as_uint(fabsf(ref) + ulp_margin) & 0x7F800000u);
    return limit + binade * 0x1p-7f;
  }
};

// found[0] += the elements where |ours - ref| exceeds the tolerance or either is not finite;
// found[1] = min(found[1], the smallest such index).
template <typename Ours, typename Ref>
__global__ void FindBeyond(const Ours* ours, const Ref* reference, size_t count,
                           Tolerance tolerance, float max_reference, unsigned long long* found) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const float a = ToFloat(ours[i]), b = ToFloat(reference[i]);
    if (!(fabsf(a - b) <= tolerance.Limit(b, max_reference))) {
      ++local;
      atomicMin(found + 1, static_cast<unsigned long long>(i));
    }
  }
  if (local != 0) atomicAdd(found, local);
}

// Elements whose values, widened to f32, differ in bits between a and b.
template <typename A, typename B>
__global__ void CountDifferentBits(const A* a, const B* b, size_t count,
                                   unsigned long long* different) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    local += __float_as_uint(ToFloat(a[i])) != __float_as_uint(ToFloat(b[i]));
  }
  if (local != 0) atomicAdd(different, local);
}

__global__ void CountNotBits(const uint16_t* a, size_t count, uint16_t bits,
                             unsigned long long* different) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    local += a[i] != bits;
  }
  if (local != 0) atomicAdd(different, local);
}

// a (rows, f) = silu(gate) * up * scale[row] of y (rows, 2 f) = [gate | up], by the engine's
// formula.
__global__ void SwigluReference(const bf16* y, const float* scale, int64_t rows, int64_t f,
                                bf16* a) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * f;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / f, c = i % f;
    const float gate = __bfloat162float(y[row * 2 * f + c]);
    const float up = __bfloat162float(y[row * 2 * f + f + c]);
    a[i] = __float2bfloat16(moe::cuda::SwigluValue(gate, up, scale[row]));
  }
}

constexpr int kGrid = 2048, kBlock = 256;

// dh (rows, 2 f) = [dgate | dup] of silu(gate) * up * scale[row] (scale nullptr: 1) given its
// gradient da (rows, f), h (rows, 2 f) = [gate | up], by the engine's formula; unless dscale is
// nullptr, dscale[row] = the row's sum of the formula's products, in double in a fixed order (a
// block per row, kBlock threads).
__global__ void SwigluBackwardReference(const bf16* da, const bf16* h, const float* scale,
                                        int64_t rows, int64_t f, bf16* dh, float* dscale) {
  __shared__ double partial[kBlock];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float s = scale != nullptr ? scale[row] : 1.0f;
    double sum = 0;
    for (int64_t c = threadIdx.x; c < f; c += blockDim.x) {
      const int64_t gate = row * 2 * f + c, up = gate + f;
      const moe::cuda::SwigluGradient g = moe::cuda::SwigluGradients(
          __bfloat162float(h[gate]), __bfloat162float(h[up]), s, __bfloat162float(da[row * f + c]));
      dh[gate] = __float2bfloat16(g.gate);
      dh[up] = __float2bfloat16(g.up);
      sum += g.product;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned stride = kBlock / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0 && dscale != nullptr) dscale[row] = static_cast<float>(partial[0]);
    __syncthreads();  // partial[0] read before the next row overwrites it
  }
}

// The time of a cuBLAS baseline, as MedianMs; NaN (not run) also with PROBE_OURS_ONLY=1 in the
// environment (for comparing builds of our kernels, where the baselines only cost time).
double BaselineMs(const std::function<void()>& run, const char* what) {
  static const bool ours_only = EnvironmentFlag("PROBE_OURS_ONLY");
  return ours_only ? std::nan("") : MedianMs(run, what);
}

// ---------------------------------------------------------------- cases

struct Model {
  const char* name;
  int hidden, experts, top_k, ffn, tokens;  // tokens: what the random and one-expert routings route
};

struct Case {
  std::string name;
  Model model;
  std::vector<int32_t> offsets;  // experts + 1
  int64_t rows() const { return offsets.back(); }
  int groups() const { return static_cast<int>(offsets.size()) - 1; }
  int Count(int g) const { return offsets[g + 1] - offsets[g]; }  // group g's rows
  int Largest() const {
    int largest = 0;
    for (int g = 0; g < groups(); ++g) largest = std::max(largest, Count(g));
    return largest;
  }
};

// Groups of the given row counts.
std::vector<int32_t> FixedRouting(const std::vector<int32_t>& counts) {
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
  return offsets;
}

// top_k distinct experts per token, uniformly among those not in `empty`.
std::vector<int32_t> RandomRouting(const Model& m, const std::vector<int>& empty, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> allowed;
  for (int e = 0; e < m.experts; ++e) {
    if (std::find(empty.begin(), empty.end(), e) == empty.end()) allowed.push_back(e);
  }
  std::vector<int32_t> counts(m.experts, 0);
  for (int t = 0; t < m.tokens; ++t) {
    std::vector<int> pool = allowed;
    for (int j = 0; j < m.top_k; ++j) {
      std::uniform_int_distribution<int> pick(j, static_cast<int>(pool.size()) - 1);
      std::swap(pool[j], pool[pick(rng)]);
      ++counts[pool[j]];
    }
  }
  return FixedRouting(counts);
}

// rows_per_group rows in every group.
std::vector<int32_t> EvenRouting(const Model& m, int rows_per_group) {
  return FixedRouting(std::vector<int32_t>(m.experts, rows_per_group));
}

// PROBE_ROUTING's case ("model given routing") among `models`, or nullopt when it is not set;
// exits 2 on a value that names no model or gives other than one count >= 0 per expert.
std::optional<Case> GivenRoutingCase(const std::vector<Model>& models) {
  const char* value = std::getenv("PROBE_ROUTING");
  if (value == nullptr) return std::nullopt;
  const std::string text = value;
  const size_t colon = text.find(':');
  const auto model = std::find_if(models.begin(), models.end(), [&](const Model& m) {
    return colon != std::string::npos && text.compare(0, colon, m.name) == 0 &&
           std::strlen(m.name) == colon;
  });
  std::vector<int32_t> counts;
  bool valid = model != models.end();
  for (size_t begin = colon + 1; valid && begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    char* parsed_end = nullptr;
    const long count = std::strtol(text.c_str() + begin, &parsed_end, 10);
    valid = end > begin && parsed_end == text.c_str() + end && count >= 0 && count <= (1 << 24);
    counts.push_back(static_cast<int32_t>(count));
    begin = end + 1;
  }
  if (!valid || static_cast<int>(counts.size()) != model->experts) {
    std::fprintf(stderr,
                 "PROBE_ROUTING must be model:count,... with one count >= 0 per expert "
                 "of qwen3-30b-a3b, mixtral-8x7b or deepseek-v3-like, not %s\n",
                 value);
    std::exit(2);
  }
  return Case{std::string(model->name) + " given routing", *model, FixedRouting(counts)};
}

std::vector<int32_t> OneExpertRouting(const Model& m, int expert) {
  std::vector<int32_t> offsets(m.experts + 1, 0);
  for (int e = expert + 1; e <= m.experts; ++e) offsets[e] = m.tokens * m.top_k;
  return offsets;
}

// ---------------------------------------------------------------- checks and report

struct Tally {
  int passed = 0, failed = 0;

  void Record(bool ok, const std::string& what, const std::string& detail) {
    (ok ? passed : failed)++;
    std::printf("    %s  %-34s %s\n", ok ? "PASS" : "FAIL", what.c_str(), detail.c_str());
  }
};

float HostFloat(float v) { return v; }
float HostFloat(bf16 v) { return __bfloat162float(v); }

// On a failure, also prints where the first bad element is: (matrix, row, column) of a
// row-major (matrices, rows, columns) layout.
template <typename Ours, typename Ref>
void CheckClose(Tally& tally, const std::string& what, const Ours* ours, const Ref* reference,
                size_t count, int64_t rows, int64_t columns, const Tolerance& tolerance) {
  DeviceArray<ErrorStats> stats(1);
  MOE_CHECK_CUDA(cudaMemset(stats.data, 0, sizeof(ErrorStats)));
  Compare<<<kGrid, kBlock>>>(ours, reference, count, stats.data);
  MOE_CHECK_CUDA(cudaGetLastError());
  ErrorStats host;
  MOE_CHECK_CUDA(cudaMemcpy(&host, stats.data, sizeof host, cudaMemcpyDeviceToHost));
  float max_error, max_reference;
  std::memcpy(&max_error, &host.max_error_bits, 4);
  std::memcpy(&max_reference, &host.max_reference_bits, 4);
  DeviceArray<unsigned long long> found(2);  // count, first index
  MOE_CHECK_CUDA(cudaMemset(found.data, 0, 8));
  MOE_CHECK_CUDA(cudaMemset(found.data + 1, 0xFF, 8));
  FindBeyond<<<kGrid, kBlock>>>(ours, reference, count, tolerance, max_reference, found.data);
  MOE_CHECK_CUDA(cudaGetLastError());
  unsigned long long beyond[2];
  MOE_CHECK_CUDA(cudaMemcpy(beyond, found.data, sizeof beyond, cudaMemcpyDeviceToHost));
  const double relative = max_reference > 0 ? max_error / max_reference : max_error;
  char absolute[32] = "";
  if (tolerance.absolute > 0) {
    std::snprintf(absolute, sizeof absolute, " + %.0e", tolerance.absolute);
  }
  char detail[200];
  std::snprintf(detail, sizeof detail,
                "rel err %.2e (max|ref| %.3g, tol %.0e%s%s), %llu beyond tol, non-finite %llu",
                relative, max_reference, tolerance.of_max_reference,
                tolerance.bf16_ulp ? " + 1 bf16 ulp" : "", absolute, beyond[0], host.non_finite);
  const bool ok = host.non_finite == 0 && beyond[0] == 0;
  tally.Record(ok, what, detail);
  const unsigned long long index = beyond[1];
  if (ok || index >= count) return;
  Ours a;
  Ref b;
  MOE_CHECK_CUDA(cudaMemcpy(&a, ours + index, sizeof a, cudaMemcpyDeviceToHost));
  MOE_CHECK_CUDA(cudaMemcpy(&b, reference + index, sizeof b, cudaMemcpyDeviceToHost));
  const long long matrix = index / (rows * columns), in_matrix = index % (rows * columns);
  std::printf("          first bad element: matrix %lld, row %lld, column %lld: ours %g, ref %g\n",
              matrix, in_matrix / columns, in_matrix % columns, HostFloat(a), HostFloat(b));
}

unsigned long long ReadCounter(const DeviceArray<unsigned long long>& counter) {
  unsigned long long host = 0;
  MOE_CHECK_CUDA(cudaMemcpy(&host, counter.data, sizeof host, cudaMemcpyDeviceToHost));
  return host;
}

// Whether the count elements of ours and reference hold the same bits (bf16 widens to f32
// exactly: a memcmp).
template <typename T>
void CheckBitIdentical(Tally& tally, const std::string& what, const T* ours, const T* reference,
                       size_t count, const std::string& reference_name) {
  DeviceArray<unsigned long long> different(1);
  MOE_CHECK_CUDA(cudaMemset(different.data, 0, 8));
  CountDifferentBits<<<kGrid, kBlock>>>(ours, reference, count, different.data);
  MOE_CHECK_CUDA(cudaGetLastError());
  const unsigned long long differ = ReadCounter(different);
  tally.Record(differ == 0, what,
               std::to_string(differ) + " elements differ from " + reference_name);
}

// Guard rows (kGuardRows x columns after rows x columns of `out`) that still hold the sentinel.
void CheckGuardRows(Tally& tally, const std::string& what, const bf16* out, int64_t rows,
                    int64_t columns) {
  DeviceArray<unsigned long long> changed(1);
  MOE_CHECK_CUDA(cudaMemset(changed.data, 0, 8));
  CountNotBits<<<kGrid, kBlock>>>(reinterpret_cast<const uint16_t*>(out + rows * columns),
                                  kGuardRows * columns, kSentinelBits, changed.data);
  const unsigned long long guard_changed = ReadCounter(changed);
  tally.Record(guard_changed == 0, what + " guard rows",
               std::to_string(guard_changed) + " elements past the last row written");
}

// One timing line; none for a NaN time (ChecksOnly()).
void PrintTime(const char* name, double ms, double flops, double bytes = 0) {
  if (std::isnan(ms)) return;
  std::printf("      %-38s %9.3f ms %8.1f TFLOP/s", name, ms, flops / (ms * 1e-3) / 1e12);
  if (bytes > 0) std::printf("   dw traffic %6.0f GB/s", bytes / (ms * 1e-3) / 1e9);
  std::printf("\n");
}

// ---------------------------------------------------------------- cuBLAS (row-major as
// column-major transposes, as engine/kernels/cuda/grouped_gemm/grouped_matmul.cu)

struct Cublas {
  cublasHandle_t handle;
  Cublas() { MOE_CHECK_CUBLAS(cublasCreate(&handle)); }
  ~Cublas() { cublasDestroy(handle); }
};

// One grouped call: problem i computes C_i (m_i, n_i) = op(A_i) op(B_i) + beta C_i column-major.
struct GroupedCall {
  std::vector<cublasOperation_t> transa, transb;
  std::vector<int> m, n, k, lda, ldb, ldc, sizes;
  std::vector<float> alpha, beta;
  std::vector<const void*> pointers;  // all A, then all B, then all C
  std::unique_ptr<DeviceArray<const void*>> device_pointers;

  void Add(cublasOperation_t ta, cublasOperation_t tb, int mm, int nn, int kk, int la, int lb,
           int lc, float b) {
    transa.push_back(ta);
    transb.push_back(tb);
    m.push_back(mm);
    n.push_back(nn);
    k.push_back(kk);
    lda.push_back(la);
    ldb.push_back(lb);
    ldc.push_back(lc);
    sizes.push_back(1);
    alpha.push_back(1.0f);
    beta.push_back(b);
  }

  // a, b, c: the problems' matrices in the order of Add.
  void Upload(const std::vector<const void*>& a, const std::vector<const void*>& b,
              const std::vector<const void*>& c) {
    pointers = a;
    pointers.insert(pointers.end(), b.begin(), b.end());
    pointers.insert(pointers.end(), c.begin(), c.end());
    device_pointers = std::make_unique<DeviceArray<const void*>>(pointers.size());
    MOE_CHECK_CUDA(cudaMemcpy(device_pointers->data, pointers.data(),
                              pointers.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }

  void Run(cublasHandle_t h, cudaDataType_t ab, cudaDataType_t c, cublasComputeType_t compute) {
    const size_t count = m.size();
    const void* const* p = device_pointers->data;
    MOE_CHECK_CUBLAS(cublasGemmGroupedBatchedEx(
        h, transa.data(), transb.data(), m.data(), n.data(), k.data(), alpha.data(), p, ab,
        lda.data(), p + count, ab, ldb.data(), beta.data(), const_cast<void* const*>(p + 2 * count),
        c, ldc.data(), static_cast<int>(count), sizes.data(), compute));
  }
};

// ---------------------------------------------------------------- the operations

struct Operands {
  const Case& c;
  DeviceArray<int32_t> offsets;
  Operands(const Case& cs) : c(cs), offsets(cs.offsets.size()) {
    MOE_CHECK_CUDA(
        cudaMemcpy(offsets.data, cs.offsets.data(), cs.offsets.size() * 4, cudaMemcpyHostToDevice));
  }
};

// reference (rows, n) = x (rows, k) · op(w_g) per non-empty group by cublasGemmEx (bf16 out), w
// (groups, n, k) if transpose_w else (groups, k, n).
void ForwardReference(Cublas& cublas, const Case& c, const bf16* x, const bf16* w, int64_t n,
                      int64_t k, bool transpose_w, bf16* reference) {
  const float one = 1.0f, zero = 0.0f;
  for (int g = 0; g < c.groups(); ++g) {
    const int64_t begin = c.offsets[g], count = c.offsets[g + 1] - begin;
    if (count == 0) continue;
    // y_g^T (n, count) = op(w_g)^T (n, k) · x_g^T (k, count)
    MOE_CHECK_CUBLAS(
        cublasGemmEx(cublas.handle, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, count,
                     k, &one, w + static_cast<int64_t>(g) * n * k, CUDA_R_16BF, transpose_w ? k : n,
                     x + begin * k, CUDA_R_16BF, k, &zero, reference + begin * n, CUDA_R_16BF, n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// Device 0's SMs.
int SmCount() {
  static const int sm_count = [] {
    int count = 0;
    MOE_CHECK_CUDA(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, 0));
    return count;
  }();
  return sm_count;
}

// The plain products' workspace for their split tail tiles, for device 0's SMs (allocated once).
moe::cuda::sm90::SplitWorkspace ProbeSplitWorkspace() {
  namespace sm90 = moe::cuda::sm90;
  static const sm90::SplitWorkspace workspace = [] {
    sm90::SplitWorkspace made{};
    if (!EnvironmentFlag("PROBE_NO_SPLIT")) MOE_CHECK_CUDA(sm90::AllocateSplitWorkspace(0, &made));
    return made;
  }();
  return workspace;
}

// How the plain products split this case's last wave of cluster tiles (TailSplit) over n_tiles
// column tiles and k, on one cluster per two SMs (the kernels' persistent grid on an H100/H200).
std::string TailSplitNote(const Case& c, int64_t n_tiles, int64_t k) {
  namespace sm90 = moe::cuda::sm90;
  int tiles = 0;
  for (int g = 0; g < c.groups(); ++g) tiles += sm90::ClusterTiles(c.Count(g), n_tiles);
  const sm90::TailSplit plan = sm90::TailSplit::Of(
      tiles, SmCount() / sm90::kForwardCluster,
      static_cast<int>((k + sm90::kBlockK - 1) / sm90::kBlockK), sm90::SplitSlots(SmCount()));
  if (plan.tail == 0) return "";
  return ", the last " + std::to_string(plan.tail) + " of " + std::to_string(tiles) +
         " cluster tiles in " + std::to_string(plan.pieces) + " pieces";
}

// y (rows, n) = x (rows, k) · op(w_g), w (groups, n, k) if transpose_w else (groups, k, n).
void ProbeForward(Tally& tally, Cublas& cublas, const Operands& ops, const char* name, int64_t n,
                  int64_t k, bool transpose_w, uint64_t seed) {
  const Case& c = ops.c;
  const int64_t rows = c.rows();
  const int groups = c.groups();
  std::printf(
      "  %s: y (%lld, %lld) = x (%lld, %lld) . w_g%s, %d groups%s\n", name,
      static_cast<long long>(rows), static_cast<long long>(n), static_cast<long long>(rows),
      static_cast<long long>(k), transpose_w ? "^T" : "", groups,
      TailSplitNote(c, (n + moe::cuda::sm90::kBlockN - 1) / moe::cuda::sm90::kBlockN, k).c_str());
  DeviceArray<bf16> x(rows * k), w(static_cast<size_t>(groups) * n * k);
  DeviceArray<bf16> y((rows + kGuardRows) * n), reference(rows * n);
  FillUniform<<<kGrid, kBlock>>>(x.data, x.count, seed);
  FillUniform<<<kGrid, kBlock>>>(w.data, w.count, seed + 1);
  FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(y.data), y.count, kSentinelBits);
  MOE_CHECK_CUDA(cudaGetLastError());

  const float one = 1.0f, zero = 0.0f;
  GroupedCall grouped;
  std::vector<const void*> pa, pb, pc;
  ForwardReference(cublas, c, x.data, w.data, n, k, transpose_w, reference.data);
  for (int g = 0; g < groups; ++g) {
    const int64_t begin = c.offsets[g], count = c.offsets[g + 1] - begin;
    if (count == 0) continue;
    const bf16* wg = w.data + static_cast<int64_t>(g) * n * k;
    grouped.Add(transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, count, k,
                transpose_w ? k : n, k, n, 0.0f);
    pa.push_back(wg);
    pb.push_back(x.data + begin * k);
    pc.push_back(reference.data + begin * n);
  }
  const auto ours = [&] {
    MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulSm90(x.data, w.data, ops.offsets.data, groups,
                                                      rows, n, k, transpose_w, y.data,
                                                      ProbeSplitWorkspace(), nullptr));
  };
  ours();
  SyncOrTimeout(name);
  CheckClose(tally, std::string(name) + " y", y.data, reference.data, rows * n, rows, n,
             Tolerance{kBf16Tolerance});
  CheckGuardRows(tally, name, y.data, rows, n);

  const double flops = 2.0 * rows * n * k;
  PrintTime("sm90 grouped (ours)", MedianMs(ours, name), flops);
  PrintTime(
      "per-group cublasGemmEx (unfused path)",
      BaselineMs(
          [&] { ForwardReference(cublas, c, x.data, w.data, n, k, transpose_w, reference.data); },
          name),
      flops);
  if (!grouped.m.empty()) {
    grouped.Upload(pa, pb, pc);
    PrintTime("cublasGemmGroupedBatchedEx bf16",
              BaselineMs(
                  [&] { grouped.Run(cublas.handle, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F); },
                  name),
              flops);
  }
  PrintTime(
      "dense cublasGemmEx, same FLOPs",
      BaselineMs(
          [&] {
            MOE_CHECK_CUBLAS(cublasGemmEx(
                cublas.handle, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, rows, k,
                &one, w.data, CUDA_R_16BF, transpose_w ? k : n, x.data, CUDA_R_16BF, k, &zero,
                reference.data, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          },
          name),
      flops);
}

// fc1 with SwiGLU: y (rows, 2 f) = x (rows, k) · w_g^T, w (groups, 2 f, k), and a (rows, f) =
// silu(gate) * up * scale[row] of y's halves, bit-identical to SwigluReference on our y.
void ProbeSwiglu(Tally& tally, Cublas& cublas, const Operands& ops, int64_t f, int64_t k,
                 uint64_t seed) {
  const Case& c = ops.c;
  const int64_t rows = c.rows(), n = 2 * f;
  const int groups = c.groups();
  std::printf("  fc1 forward + SwiGLU: y (%lld, %lld) = x . w_g^T, a (%lld, %lld)\n",
              static_cast<long long>(rows), static_cast<long long>(n), static_cast<long long>(rows),
              static_cast<long long>(f));
  DeviceArray<bf16> x(rows * k), w(static_cast<size_t>(groups) * n * k);
  DeviceArray<bf16> y((rows + kGuardRows) * n), a((rows + kGuardRows) * f);
  DeviceArray<bf16> y_reference(rows * n), a_reference(rows * f);
  DeviceArray<float> scale(rows);
  FillUniform<<<kGrid, kBlock>>>(x.data, x.count, seed);
  FillUniform<<<kGrid, kBlock>>>(w.data, w.count, seed + 1);
  FillUniform<<<kGrid, kBlock>>>(scale.data, scale.count, seed + 2);
  FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(y.data), y.count, kSentinelBits);
  FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(a.data), a.count, kSentinelBits);
  MOE_CHECK_CUDA(cudaGetLastError());
  ForwardReference(cublas, c, x.data, w.data, n, k, /*transpose_w=*/true, y_reference.data);
  const auto ours = [&] {
    MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulSwigluSm90(
        x.data, w.data, ops.offsets.data, groups, rows, f, k, scale.data, y.data, a.data, nullptr));
  };
  ours();
  SyncOrTimeout("fc1 forward + SwiGLU");
  CheckClose(tally, "fc1+SwiGLU y", y.data, y_reference.data, rows * n, rows, n,
             Tolerance{kBf16Tolerance});
  SwigluReference<<<kGrid, kBlock>>>(y.data, scale.data, rows, f, a_reference.data);
  CheckBitIdentical(tally, "fc1+SwiGLU a bit-identical", a.data, a_reference.data, rows * f,
                    "SwiGLU of our y");
  CheckGuardRows(tally, "fc1+SwiGLU y", y.data, rows, n);
  CheckGuardRows(tally, "fc1+SwiGLU a", a.data, rows, f);
  const double flops = 2.0 * rows * n * k;
  PrintTime("sm90 grouped + SwiGLU (ours)", MedianMs(ours, "fc1 forward + SwiGLU"), flops);
  PrintTime("sm90 grouped (ours), y only",
            MedianMs(
                [&] {
                  MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulSm90(
                      x.data, w.data, ops.offsets.data, groups, rows, n, k, true, y.data,
                      ProbeSplitWorkspace(), nullptr));
                },
                "fc1 forward"),
            flops);
}

// fc2 dgrad with the SwiGLU backward: da (rows, f) = dy (rows, k) · w_g, w (groups, k, f), not
// stored; dh (rows, 2 f) = [dgate | dup] of silu(gate) * up * scale[row] given da, with gate and
// up from h (rows, 2 f), and dscale (rows) = the row sums of silu(gate) * up * da. Against
// SwigluBackwardReference on our fc2 dgrad's da (GroupedMatmulSm90, which ProbeForward checks
// against cuBLAS): dh bit-identical, dscale within f32 summation-order noise.
void ProbeSwigluBackward(Tally& tally, const Operands& ops, int64_t f, int64_t k, uint64_t seed) {
  const char* const name = "fc2 dgrad + swiglu bwd";
  const Case& c = ops.c;
  const int64_t rows = c.rows(), n = 2 * f;
  const int groups = c.groups();
  std::printf("  %s: da (%lld, %lld) = dy . w_g, dh (%lld, %lld), dscale (%lld)\n", name,
              static_cast<long long>(rows), static_cast<long long>(f), static_cast<long long>(rows),
              static_cast<long long>(n), static_cast<long long>(rows));
  DeviceArray<bf16> dy(rows * k), w(static_cast<size_t>(groups) * k * f), h(rows * n), da(rows * f);
  DeviceArray<bf16> dh((rows + kGuardRows) * n), dh_reference(rows * n);
  DeviceArray<float> scale(rows), dscale(rows), dscale_reference(rows);
  DeviceArray<float> partials(moe::cuda::sm90::SwigluBackwardPartialTiles(f) * rows);
  FillUniform<<<kGrid, kBlock>>>(dy.data, dy.count, seed);
  FillUniform<<<kGrid, kBlock>>>(w.data, w.count, seed + 1);
  FillUniform<<<kGrid, kBlock>>>(h.data, h.count, seed + 2);
  FillUniform<<<kGrid, kBlock>>>(scale.data, scale.count, seed + 3);
  FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(dh.data), dh.count, kSentinelBits);
  FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(dscale.data), dscale.count * 2,
                              kSentinelBits);  // f32 NaN too
  MOE_CHECK_CUDA(cudaGetLastError());
  // da with every tile whole, as the SwiGLU gradient's kernel computes it (no split tail).
  const auto dgrad = [&] {
    MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulSm90(dy.data, w.data, ops.offsets.data, groups,
                                                      rows, f, k, false, da.data,
                                                      moe::cuda::sm90::SplitWorkspace{}, nullptr));
  };
  dgrad();
  SwigluBackwardReference<<<kGrid, kBlock>>>(da.data, h.data, scale.data, rows, f,
                                             dh_reference.data, dscale_reference.data);
  MOE_CHECK_CUDA(cudaGetLastError());
  const auto ours = [&](const float* scale_or_null, float* dscale_or_null) {
    MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulSwigluBackwardSm90(
        dy.data, w.data, ops.offsets.data, groups, rows, f, k, scale_or_null, h.data, dh.data,
        partials.data, dscale_or_null, nullptr));
  };
  ours(scale.data, dscale.data);
  SyncOrTimeout(name);
  CheckBitIdentical(tally, "fc2+SwiGLU bwd dh bit-identical", dh.data, dh_reference.data, rows * n,
                    "SwiGLU bwd of our da");
  CheckClose(tally, "fc2+SwiGLU bwd dscale", dscale.data, dscale_reference.data, rows, rows, 1,
             Tolerance{kDscaleTolerance, false, 0.0f, kDscaleFloor});
  CheckGuardRows(tally, "fc2+SwiGLU bwd dh", dh.data, rows, n);

  // Without scale and dscale: against scale 1.
  FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(dh.data), dh.count, kSentinelBits);
  SwigluBackwardReference<<<kGrid, kBlock>>>(da.data, h.data, nullptr, rows, f, dh_reference.data,
                                             nullptr);
  MOE_CHECK_CUDA(cudaGetLastError());
  ours(nullptr, nullptr);
  SyncOrTimeout(name);
  CheckBitIdentical(tally, "fc2+SwiGLU bwd dh (scale nullptr)", dh.data, dh_reference.data,
                    rows * n, "SwiGLU bwd of our da, scale 1");

  const double flops = 2.0 * rows * f * k;
  PrintTime("sm90 grouped + SwiGLU bwd (ours)",
            MedianMs([&] { ours(scale.data, dscale.data); }, name), flops);
  PrintTime("sm90 grouped (ours), da only", MedianMs(dgrad, "fc2 dgrad"), flops);
}

// dw (groups, n, k) (+)= dy_g^T (n, rows_g) · x_g (rows_g, k), with an f32 and with a bf16 dw.
void ProbeWeightGrad(Tally& tally, Cublas& cublas, const Operands& ops, const char* name, int64_t n,
                     int64_t k, uint64_t seed) {
  const Case& c = ops.c;
  const int64_t rows = c.rows();
  const int groups = c.groups();
  const size_t dw_count = static_cast<size_t>(groups) * n * k;
  std::printf("  %s: dw (%d, %lld, %lld) += dy (%lld, %lld)^T . x (%lld, %lld) per group\n", name,
              groups, static_cast<long long>(n), static_cast<long long>(k),
              static_cast<long long>(rows), static_cast<long long>(n), static_cast<long long>(rows),
              static_cast<long long>(k));
  DeviceArray<bf16> dy(rows * n), x(rows * k);
  DeviceArray<float> dw(dw_count), reference(dw_count);  // dw: f32, or bf16 in its first half
  FillUniform<<<kGrid, kBlock>>>(dy.data, dy.count, seed);
  FillUniform<<<kGrid, kBlock>>>(x.data, x.count, seed + 1);
  MOE_CHECK_CUDA(cudaGetLastError());

  const float one = 1.0f;
  int nonempty = 0;
  for (int g = 0; g < groups; ++g) nonempty += c.offsets[g + 1] != c.offsets[g];
  // reference = the products (zeros for empty groups).
  const auto products = [&] {
    MOE_CHECK_CUDA(cudaMemset(reference.data, 0, reference.count * sizeof(float)));
    for (int g = 0; g < groups; ++g) {
      const int64_t begin = c.offsets[g], count = c.offsets[g + 1] - begin;
      if (count == 0) continue;
      // dw_g^T (k, n) += x_g^T (k, count) · dy_g (count, n)
      MOE_CHECK_CUBLAS(cublasGemmEx(cublas.handle, CUBLAS_OP_N, CUBLAS_OP_T, k, n, count, &one,
                                    x.data + begin * k, CUDA_R_16BF, k, dy.data + begin * n,
                                    CUDA_R_16BF, n, &one, reference.data + g * n * k, CUDA_R_32F, k,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  };
  const double flops = 2.0 * rows * n * k;
  const double bf16_floor = kBf16DwFloor * std::max(1.0, c.Largest() / kBf16DwFloorRows);
  // dw bytes moved in the non-empty groups: written, and for += also read.
  const auto dw_traffic = [&](size_t element_bytes, bool accumulate) {
    return (accumulate ? 2.0 : 1.0) * nonempty * n * k * element_bytes;
  };

  // The rows as one part, and cut into three parts at rows that are no multiple of the 64-row K
  // step (so groups straddle the cuts, and each part ends in a partial step): the parts' offsets
  // are the case's shifted and clamped to each part. Their sum is the same product.
  std::vector<moe::cuda::sm90::WeightGradRows> whole = {{dy.data, x.data, ops.offsets.data, rows}};
  const int64_t cuts[] = {0, rows / 3 + 5, 2 * rows / 3 + 37, rows};
  DeviceArray<int32_t> part_offsets(3 * c.offsets.size());
  std::vector<moe::cuda::sm90::WeightGradRows> split;
  for (int p = 0; p < 3; ++p) {
    const int64_t begin = std::min(cuts[p], rows), end = std::min(cuts[p + 1], rows);
    std::vector<int32_t> shifted(c.offsets.size());
    for (size_t g = 0; g < shifted.size(); ++g) {
      shifted[g] = static_cast<int32_t>(std::clamp<int64_t>(c.offsets[g] - begin, 0, end - begin));
    }
    int32_t* device_offsets = part_offsets.data + p * c.offsets.size();
    MOE_CHECK_CUDA(
        cudaMemcpy(device_offsets, shifted.data(), shifted.size() * 4, cudaMemcpyHostToDevice));
    split.push_back({dy.data + begin * n, x.data + begin * k, device_offsets, end - begin});
  }

  // dw = (TMA stores) into NaN, against reference = the products (zeros for empty groups); or
  // dw += (TMA reduce-add) into uniform values, against reference + those values as dw holds
  // them (empty groups: exactly those values). Over the rows in `parts`.
  const auto probe = [&](auto* dw_out, bool accumulate,
                         const std::vector<moe::cuda::sm90::WeightGradRows>& parts) {
    using Out = std::remove_pointer_t<decltype(dw_out)>;
    constexpr bool kF32 = std::is_same_v<Out, float>;
    products();
    if (accumulate) {
      FillUniform<<<kGrid, kBlock>>>(dw_out, dw_count, seed + 2);
      AddInto<<<kGrid, kBlock>>>(dw_out, reference.data, dw_count);
    } else {
      FillBits<<<kGrid, kBlock>>>(reinterpret_cast<uint16_t*>(dw_out), dw_count * sizeof(Out) / 2,
                                  kSentinelBits);  // f32 NaN too
    }
    MOE_CHECK_CUDA(cudaGetLastError());
    const auto ours = [&] {
      MOE_CHECK_CUDA(moe::cuda::sm90::GroupedMatmulWeightGradSm90(
          parts.data(), static_cast<int>(parts.size()), groups, n, k, accumulate, dw_out, nullptr));
    };
    ours();
    SyncOrTimeout(name);
    const std::string label = std::string(kF32 ? "f32 " : "bf16 ") +
                              (accumulate ? "+=, TMA reduce-add" : "=, TMA store") +
                              (parts.size() > 1 ? ", 3 parts" : "");
    const std::string what = std::string(name) + " dw (" + label + ")";
    CheckClose(tally, what, dw_out, reference.data, dw_count, n, k,
               kF32 ? Tolerance{kF32Tolerance}
                    : Tolerance{bf16_floor, true, accumulate ? kInitialMagnitude : 0.0f});
    DeviceArray<unsigned long long> different(1);
    MOE_CHECK_CUDA(cudaMemset(different.data, 0, 8));
    int empty = 0;
    for (int g = 0; g < groups; ++g) {
      if (c.offsets[g + 1] != c.offsets[g]) continue;
      ++empty;
      CountDifferentBits<<<kGrid, kBlock>>>(dw_out + g * n * k, reference.data + g * n * k, n * k,
                                            different.data);
    }
    if (empty > 0) {
      const unsigned long long changed = ReadCounter(different);
      tally.Record(changed == 0, what + " empty groups",
                   std::to_string(changed) + " elements of " + std::to_string(empty) +
                       " empty groups not " + (accumulate ? "unchanged" : "zero"));
    }
    PrintTime(("sm90 (ours), " + label).c_str(), MedianMs(ours, name), flops,
              dw_traffic(sizeof(Out), accumulate));
  };
  for (const auto* parts : {&whole, &split}) {
    for (const bool accumulate : {false, true}) probe(dw.data, accumulate, *parts);
    for (const bool accumulate : {false, true}) {
      probe(reinterpret_cast<bf16*>(dw.data), accumulate, *parts);
    }
  }

  // Baselines write into `reference` (no longer needed), reinterpreted as their output type.
  GroupedCall grouped;
  std::vector<const void*> pa, pb, pc, pa32, pb32, pc32;
  DeviceArray<float> dy32(rows * n), x32(rows * k);
  for (int g = 0; g < groups; ++g) {
    const int64_t begin = c.offsets[g], count = c.offsets[g + 1] - begin;
    if (count == 0) continue;
    grouped.Add(CUBLAS_OP_N, CUBLAS_OP_T, k, n, count, k, n, k, 1.0f);
    pa.push_back(x.data + begin * k);
    pb.push_back(dy.data + begin * n);
    pc.push_back(reinterpret_cast<bf16*>(reference.data) + g * n * k);
    pa32.push_back(x32.data + begin * k);
    pb32.push_back(dy32.data + begin * n);
    pc32.push_back(reference.data + g * n * k);
  }
  if (!grouped.m.empty()) {
    grouped.Upload(pa, pb, pc);
    PrintTime("cublasGemmGroupedBatchedEx bf16 -> bf16",
              BaselineMs(
                  [&] { grouped.Run(cublas.handle, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F); },
                  name),
              flops, dw_traffic(sizeof(bf16), true));
    grouped.Upload(pa32, pb32, pc32);
    PrintTime("engine's cuBLAS path: widen + TF32 grouped f32",
              BaselineMs(
                  [&] {
                    Widen<<<kGrid, kBlock>>>(dy.data, dy32.data, dy.count);
                    Widen<<<kGrid, kBlock>>>(x.data, x32.data, x.count);
                    grouped.Run(cublas.handle, CUDA_R_32F, CUDA_R_32F,
                                CUBLAS_COMPUTE_32F_FAST_TF32);
                  },
                  name),
              flops, dw_traffic(sizeof(float), true));
  }
  PrintTime("dense cublasGemmEx bf16 -> f32, same FLOPs",
            BaselineMs(
                [&] {
                  MOE_CHECK_CUBLAS(cublasGemmEx(cublas.handle, CUBLAS_OP_N, CUBLAS_OP_T, k, n, rows,
                                                &one, x.data, CUDA_R_16BF, k, dy.data, CUDA_R_16BF,
                                                n, &one, reference.data, CUDA_R_32F, k,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                },
                name),
            flops);
}

void ProbeCase(Tally& tally, Cublas& cublas, const Case& c) {
  const Model& m = c.model;
  int empty = 0;
  for (int g = 0; g < c.groups(); ++g) empty += c.Count(g) == 0;
  std::printf(
      "\n== %s: hidden %d, %d experts, top-%d, ffn %d, %lld tokens -> %lld rows "
      "(%d empty groups, largest %d)\n",
      c.name.c_str(), m.hidden, m.experts, m.top_k, m.ffn,
      static_cast<long long>(c.rows() / m.top_k), static_cast<long long>(c.rows()), empty,
      c.Largest());
  const Operands ops(c);
  const int64_t h = m.hidden, f = m.ffn;
  ProbeForward(tally, cublas, ops, "fc1 forward", 2 * f, h, true, 11);
  ProbeSwiglu(tally, cublas, ops, f, h, 15);
  ProbeForward(tally, cublas, ops, "fc2 forward", h, f, true, 21);
  ProbeForward(tally, cublas, ops, "fc1 dgrad", h, 2 * f, false, 31);
  ProbeForward(tally, cublas, ops, "fc2 dgrad", f, h, false, 41);
  ProbeSwigluBackward(tally, ops, f, h, 45);
  ProbeWeightGrad(tally, cublas, ops, "fc1 wgrad", 2 * f, h, 51);
  ProbeWeightGrad(tally, cublas, ops, "fc2 wgrad", h, f, 61);
}

void PrintKernelAttributes() {
  namespace sm90 = moe::cuda::sm90;
  using namespace sm90::detail;
  const struct {
    const char* name;
    const void* kernel;
    int smem_bytes;
    int cluster;
  } kernels[] = {
      {"GroupedMatmulKernel<transpose_w>",
       reinterpret_cast<const void*>(GroupedMatmulKernel<true, Epilogue::kStore>),
       ForwardPipeline<true, Epilogue::kStore>::kSmemBytes, sm90::kForwardCluster},
      {"GroupedMatmulKernel<!transpose_w>",
       reinterpret_cast<const void*>(GroupedMatmulKernel<false, Epilogue::kStore>),
       ForwardPipeline<false, Epilogue::kStore>::kSmemBytes, sm90::kForwardCluster},
      {"GroupedMatmulKernel<transpose_w, SwiGLU>",
       reinterpret_cast<const void*>(GroupedMatmulKernel<true, Epilogue::kSwiglu>),
       ForwardPipeline<true, Epilogue::kSwiglu>::kSmemBytes, sm90::kForwardCluster},
      {"GroupedMatmulKernel<!transpose_w, SwiGLU bwd>",
       reinterpret_cast<const void*>(GroupedMatmulKernel<false, Epilogue::kSwigluBackward>),
       ForwardPipeline<false, Epilogue::kSwigluBackward>::kSmemBytes, sm90::kForwardCluster},
      {"GroupedWeightGradKernel<float>",
       reinterpret_cast<const void*>(GroupedWeightGradKernel<float>), kWeightGradSmemBytes,
       sm90::kWeightGradCluster},
      {"GroupedWeightGradKernel<bf16>",
       reinterpret_cast<const void*>(GroupedWeightGradKernel<sm90::bf16>), kWeightGradSmemBytes,
       sm90::kWeightGradCluster},
  };
  for (const auto& k : kernels) {
    cudaFuncAttributes attributes;
    MOE_CHECK_CUDA(cudaFuncGetAttributes(&attributes, k.kernel));
    int clusters = 0;  // the persistent grid's size
    MOE_CHECK_CUDA(ResidentClusters(k.kernel, k.smem_bytes, k.cluster, &clusters));
    std::printf(
        "  %-46s %3d registers, %zu bytes local, %d resident clusters of %d, %d bytes of dynamic "
        "shared memory\n",
        k.name, attributes.numRegs, attributes.localSizeBytes, clusters, k.cluster, k.smem_bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  PrintSm90DeviceOrExit();
  PrintKernelAttributes();

  const Model tiny{"tiny", 64, 2, 1, 128, 200};
  const Model tiny_ends{"tiny", 64, 5, 1, 128, 577};
  const int tokens = ModelTokens();
  const Model qwen3{"qwen3-30b-a3b", 2048, 128, 8, 768, tokens};
  const Model mixtral{"mixtral-8x7b", 4096, 8, 2, 14336, tokens};
  const Model deepseek{"deepseek-v3-like", 7168, 256, 8, 2048, tokens};
  const Model tails{"tails", 1000, 6, 2, 344, 777};  // h, 2f, f multiples of 8, not of 64
  const Model split{"split", 2048, 7, 1, 1024, 4372};
  std::vector<Case> cases = {
      {"tiny random routing", tiny, RandomRouting(tiny, {}, 5)},
      // Groups ending in tiles of exactly 64 rows (alone, and as a row pair's second tile: TMA
      // stores all of them), of 37 and 28 rows (copied from the staging), and an empty group.
      {"tiny fixed routing, short last tiles", tiny_ends, FixedRouting({64, 192, 37, 0, 284})},
      {"qwen3 random routing, expert 5 empty", qwen3, RandomRouting(qwen3, {5}, 1)},
      {"qwen3 every row on expert 7", qwen3, OneExpertRouting(qwen3, 7)},
      {"mixtral random routing", mixtral, RandomRouting(mixtral, {}, 2)},
      // What an expert's partly filled last row tile costs: 8, 8.5 and 9 row tiles per group (at
      // 1088 rows each group's last tile holds 64, one consumer's rows; the other idles).
      {"mixtral even 1024 rows", mixtral, EvenRouting(mixtral, 1024)},
      {"mixtral even 1088 rows", mixtral, EvenRouting(mixtral, 1088)},
      {"mixtral even 1152 rows", mixtral, EvenRouting(mixtral, 1152)},
      {"deepseek random routing", deepseek, RandomRouting(deepseek, {}, 3)},
      // The same at the DeepSeek-V3-like shape at 16384 tokens (512 rows per expert on average).
      {"deepseek even 512 rows", deepseek, EvenRouting(deepseek, 512)},
      {"deepseek even 576 rows", deepseek, EvenRouting(deepseek, 576)},
      {"deepseek even 640 rows", deepseek, EvenRouting(deepseek, 640)},
      {"tails random routing, expert 2 empty", tails, RandomRouting(tails, {2}, 4)},
      // 17 row pairs and one odd row tile (the last group's, 44 rows). On 66 clusters (132 SMs)
      // the plain products split their last cluster tiles along k (TailSplit): over 8 column
      // tiles the last 8 of 140, the odd tile's column pairs among them, over 4 the last 4 of 70.
      {"split tail, fixed routing", split, FixedRouting({256, 512, 0, 1000, 1280, 1024, 300})},
  };
  if (std::optional<Case> given = GivenRoutingCase({qwen3, mixtral, deepseek})) {
    cases.push_back(*given);
  }
  Cublas cublas;
  Tally tally;
  for (const Case& c : cases) {
    if (c.name.find(filter) == std::string::npos) continue;
    ProbeCase(tally, cublas, c);
  }
  std::printf("\n%d passed, %d failed\n", tally.passed, tally.failed);
  if (tally.passed + tally.failed == 0) {
    std::fprintf(stderr, "no case's name contains \"%s\": nothing checked\n", filter.c_str());
    return 1;
  }
  return tally.failed == 0 ? 0 : 1;
}
