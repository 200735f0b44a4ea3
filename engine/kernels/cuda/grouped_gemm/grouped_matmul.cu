// CUDA GroupedMatmul and GroupedMatmulWeightGrad (contracts: engine/kernels/op_declarations.inc).
// The Hopper kernels (grouped_matmul_sm90.h) take the calls they can: they read the offsets on
// the device. The rest (other GPUs, f32 operands, shapes they decline) run on cuBLAS's grouped
// GEMM (cublasGemmGroupedBatchedEx, cuBLAS >= 12.5), planned from the host offsets: one launch
// for all the non-empty groups, each a cuBLAS group of one problem; groups without rows are left
// out of the call. Row-major tensors on column-major cuBLAS as in matmul.cu: a row-major (r, c)
// matrix is a column-major (c, r) one, so problem g computes out_g^T = op(b_g)^T · op(a_g)^T.
// cuBLAS reads the problems' matrix pointers from device memory: a one-block kernel writes them,
// passed as its parameters, into a small buffer from the caching allocator on the compute
// stream, so the host never waits. Sizes, leading dimensions, alpha and beta are host arrays.
// Precision as in matmul.cu (CublasComputeType). cuBLAS's grouped GEMM has no bf16 x bf16 -> f32
// form, so the bf16 weight gradient widens dy and x to f32 copies and multiplies them with
// CUBLAS_COMPUTE_32F_FAST_TF32: TF32 holds every bf16 value exactly, so the products are exact
// and accumulate in fp32. It adds into f32 only, so a bf16 dw goes through an f32 copy, rounded
// back once.
#include <algorithm>
#include <vector>

#include "engine/kernels/cuda/common/cublas_handle.h"
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/grouped_gemm/grouped_matmul_sm90.h"

namespace moe::cuda {
namespace {

// Pointers per StorePointers launch: 3.5 KiB of parameters, under the classic 4 KiB limit.
constexpr size_t kPointersPerLaunch = 448;

struct PointerBatch {
  const void* pointers[kPointersPerLaunch];
  int count;
};

__global__ void StorePointers(PointerBatch batch, const void** out) {
  for (int i = threadIdx.x; i < batch.count; i += blockDim.x) out[i] = batch.pointers[i];
}

// `pointers` copied into a new device buffer (ordered on like's compute stream).
Tensor DevicePointers(const std::vector<const void*>& pointers, const Tensor& like) {
  static_assert(sizeof(void*) == sizeof(int64_t));
  Tensor table = Tensor::Empty({static_cast<int64_t>(pointers.size())}, DType::kI64, like.device());
  auto* out = static_cast<const void**>(table.data());
  for (size_t begin = 0; begin < pointers.size(); begin += kPointersPerLaunch) {
    PointerBatch batch;
    batch.count = static_cast<int>(std::min(pointers.size() - begin, kPointersPerLaunch));
    std::copy_n(pointers.begin() + begin, batch.count, batch.pointers);
    StorePointers<<<1, 128, 0, StreamOf(like)>>>(batch, out + begin);
    MOE_CUDA_CHECK_LAUNCH();
  }
  return table;
}

// One problem in column-major terms: c (m, n) = op(a) (m, k) · op(b) (k, n) + beta * c.
struct Problem {
  int64_t m, n, k;
  const void* a;
  const void* b;
  void* c;
};

// What every problem of a call shares.
struct Layout {
  cublasOperation_t transa, transb;
  int64_t lda, ldb, ldc;
  DType ab_dtype;
  DType c_dtype;
  cublasComputeType_t compute;
  float beta;
};

// One cublasGemmGroupedBatchedEx call over `problems` (none: nothing to do), writing into `out`'s
// storage on its device's compute stream.
void RunGrouped(const Tensor& out, const Layout& layout, const std::vector<Problem>& problems) {
  if (problems.empty()) return;
  const size_t count = problems.size();
  std::vector<int> m, n, k;
  std::vector<const void*> pointers(3 * count);  // all a, then all b, then all c
  for (size_t i = 0; i < count; ++i) {
    m.push_back(CublasInt(problems[i].m));
    n.push_back(CublasInt(problems[i].n));
    k.push_back(CublasInt(problems[i].k));
    pointers[i] = problems[i].a;
    pointers[count + i] = problems[i].b;
    pointers[2 * count + i] = problems[i].c;
  }
  const std::vector<cublasOperation_t> transa(count, layout.transa), transb(count, layout.transb);
  const std::vector<int> lda(count, CublasInt(layout.lda)), ldb(count, CublasInt(layout.ldb)),
      ldc(count, CublasInt(layout.ldc)), group_sizes(count, 1);
  const std::vector<float> alpha(count, 1.0f), beta(count, layout.beta);
  const Tensor table = DevicePointers(pointers, out);
  void* const* device_pointers = static_cast<void* const*>(table.data());
  MOE_CUBLAS_CALL(cublasGemmGroupedBatchedEx(
      CublasHandle(out.device()), transa.data(), transb.data(), m.data(), n.data(), k.data(),
      alpha.data(), device_pointers, CublasDataType(layout.ab_dtype), lda.data(),
      device_pointers + count, CublasDataType(layout.ab_dtype), ldb.data(), beta.data(),
      device_pointers + 2 * count, CublasDataType(layout.c_dtype), ldc.data(), CublasInt(count),
      group_sizes.data(), layout.compute));
}

// Element `index` of t's storage, as a byte address.
char* ElementAt(const Tensor& t, int64_t index) {
  return static_cast<char*>(t.data()) + index * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// The cuBLAS path plans from host offsets, which callers give where GroupedMatmulNeedsHostOffsets
// says so.
void CheckHostOffsetsGiven(std::span<const int32_t> host_offsets, const Tensor& operand,
                           const char* what) {
  CHECK(!host_offsets.empty()) << what << " on " << operand.DebugString()
                               << " runs on cuBLAS here, which needs host offsets "
                               << "(ops::GroupedMatmulNeedsHostOffsets)";
}

void WeightGrad(const Tensor& dy, const Tensor& x, std::span<const int32_t> offsets,
                const Tensor& dw, cublasComputeType_t compute) {
  const int64_t n = dy.dim(1), k = x.dim(1);
  std::vector<Problem> problems;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t begin = offsets[g], rows = offsets[g + 1] - begin;
    if (rows == 0) continue;
    // dw_g^T (k, n) += x_g^T (k, rows) · dy_g (rows, n)
    problems.push_back({k, n, rows, ElementAt(x, begin * k), ElementAt(dy, begin * n),
                        ElementAt(dw, static_cast<int64_t>(g) * n * k)});
  }
  RunGrouped(dw, {CUBLAS_OP_N, CUBLAS_OP_T, k, n, k, x.dtype(), DType::kF32, compute, 1.0f},
             problems);
}

}  // namespace

bool GroupedMatmulNeedsHostOffsets(Device device, DType dtype, const Shape& weight_shape) {
  return !Sm90GroupedGemmTakes(device, dtype, weight_shape);
}

void GroupedMatmul(const Tensor& x, const Tensor& w, const Tensor& offsets,
                   std::span<const int32_t> host_offsets, const Tensor& y, bool transpose_w) {
  if (TryGroupedMatmulSm90(x, w, offsets, y, transpose_w)) return;
  CheckHostOffsetsGiven(host_offsets, w, "GroupedMatmul");
  const int64_t k = x.dim(1), n = y.dim(1);
  if (y.numel() == 0) return;
  if (k == 0) {  // empty sums
    Fill(y, 0.0f);
    return;
  }
  std::vector<Problem> problems;
  for (size_t g = 0; g + 1 < host_offsets.size(); ++g) {
    const int64_t begin = host_offsets[g], rows = host_offsets[g + 1] - begin;
    if (rows == 0) continue;
    // y_g^T (n, rows) = op(w_g)^T (n, k) · x_g^T (k, rows)
    problems.push_back({n, rows, k, ElementAt(w, static_cast<int64_t>(g) * n * k),
                        ElementAt(x, begin * k), ElementAt(y, begin * n)});
  }
  RunGrouped(y,
             {transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, w.dim(2), k, n, x.dtype(),
              y.dtype(), CublasComputeType(x.dtype()), 0.0f},
             problems);
}

void GroupedMatmulWeightGrad(std::span<const GroupedRows> parts, const Tensor& dw,
                             bool accumulate) {
  if (TryGroupedMatmulWeightGradSm90(parts, dw, accumulate)) return;
  if (!accumulate) Fill(dw, 0.0f);  // then += below: cuBLAS's grouped GEMM skips empty groups
  if (dw.numel() == 0) return;
  const auto as_f32 = [](const Tensor& t) {
    if (t.dtype() == DType::kF32) return t;
    Tensor wide = Tensor::Empty(t.shape(), DType::kF32, t.device());
    Cast(t, wide);
    return wide;
  };
  for (const GroupedRows& part : parts) {  // each part rounded into a bf16 dw as its own call
    CheckHostOffsetsGiven(part.host_offsets, dw, "GroupedMatmulWeightGrad");
    if (part.x.dim(0) == 0) continue;
    const Tensor dw32 = as_f32(dw);
    if (part.x.dtype() == DType::kF32) {
      WeightGrad(part.dy, part.x, part.host_offsets, dw32, CublasComputeType(DType::kF32));
    } else {
      WeightGrad(as_f32(part.dy), as_f32(part.x), part.host_offsets, dw32,
                 CUBLAS_COMPUTE_32F_FAST_TF32);
    }
    if (dw.dtype() != DType::kF32) Cast(dw32, dw);
  }
}

}  // namespace moe::cuda
