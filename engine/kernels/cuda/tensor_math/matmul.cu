// CUDA Matmul (contract: engine/kernels/op_declarations.inc) on cuBLAS. Row-major tensors on
// column-major cuBLAS: a row-major (r, c) matrix is a column-major (c, r) one, so the call
// computes out^T (n, m) = op(b)^T · op(a)^T, i.e. passes b first. 2-D is a batch of one;
// 3-D uses the strided batch. a, b f32 or bf16 (the same); out f32 or that dtype.
// Precision: CublasComputeType (f32 without TF32, bf16 on tensor cores, fp32 accumulation).
// beta == 0 never reads out.
#include "engine/kernels/cuda/common/cublas_handle.h"
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {

void Matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a, bool transpose_b,
            float beta) {
  const int r = a.ndim() - 2;  // index of the row dimension
  const int64_t batches = r == 1 ? a.dim(0) : 1;
  const int64_t m = out.dim(r), n = out.dim(r + 1);
  const int64_t k = transpose_a ? a.dim(r) : a.dim(r + 1);
  if (out.numel() == 0) return;
  if (k == 0) {  // an empty sum: out = beta * out
    if (beta == 0.0f) {
      Fill(out, 0.0f);
    } else {
      Scale(out, beta, out);
    }
    return;
  }
  const float alpha = 1.0f;
  const cudaDataType_t ab_type = CublasDataType(a.dtype());
  MOE_CUBLAS_CALL(cublasGemmStridedBatchedEx(
      CublasHandle(out.device()), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, CublasInt(n), CublasInt(m), CublasInt(k), &alpha,
      b.data(), ab_type, CublasInt(b.dim(-1)), b.numel() / batches, a.data(), ab_type,
      CublasInt(a.dim(-1)), a.numel() / batches, &beta, out.data(), CublasDataType(out.dtype()),
      CublasInt(n), m * n, CublasInt(batches), CublasComputeType(a.dtype()), CUBLAS_GEMM_DEFAULT));
}

}  // namespace moe::cuda
