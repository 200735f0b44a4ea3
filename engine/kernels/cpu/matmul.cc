// CPU Matmul: out = op(a) · op(b) + beta * out through Eigen maps of the row-major buffers.
//   2-D: a (m, k) or (k, m), b (k, n) or (n, k), out (m, n); 3-D: the same per leading batch.
// beta == 0 never reads out (it may hold garbage or NaN). a and b f32; out f32, or bf16 (a
// gradient) rounded once from the f32 result (F32Output).
#include <Eigen/Core>

#include "engine/kernels/cpu/cpu_ops.h"
#include "engine/kernels/cpu/f32_output.h"

namespace moe::cpu {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One (rows, cols) matrix of a batch of them.
template <typename T>
Eigen::Map<T> MatrixAt(float* base, int64_t batch, int64_t rows, int64_t cols) {
  return Eigen::Map<T>(base + batch * rows * cols, rows, cols);
}

}  // namespace

void Matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a, bool transpose_b,
            float beta) {
  const int r = a.ndim() - 2;
  const int64_t batches = r == 1 ? a.dim(0) : 1;
  const int64_t a_rows = a.dim(r), a_cols = a.dim(r + 1);
  const int64_t b_rows = b.dim(r), b_cols = b.dim(r + 1);
  const int64_t m = out.dim(r), n = out.dim(r + 1);
  const F32Output target(out, /*read=*/beta != 0.0f);
  for (int64_t i = 0; i < batches; ++i) {
    auto ma = MatrixAt<const RowMajor>(a.data<float>(), i, a_rows, a_cols);
    auto mb = MatrixAt<const RowMajor>(b.data<float>(), i, b_rows, b_cols);
    auto mo = MatrixAt<RowMajor>(target.f32().data<float>(), i, m, n);
    if (beta == 0.0f) {
      mo.setZero();
    } else if (beta != 1.0f) {
      mo *= beta;
    }
    if (transpose_a && transpose_b) {
      mo.noalias() += ma.transpose() * mb.transpose();
    } else if (transpose_a) {
      mo.noalias() += ma.transpose() * mb;
    } else if (transpose_b) {
      mo.noalias() += ma * mb.transpose();
    } else {
      mo.noalias() += ma * mb;
    }
  }
  target.Commit();
}

}  // namespace moe::cpu
