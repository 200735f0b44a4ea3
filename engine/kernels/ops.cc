// The ops API front: shape and dtype checks shared by every backend, then dispatch on device.
// Backends may assume what is checked here.
#include "engine/kernels/ops.h"

#include <algorithm>
#include <initializer_list>
#include <span>
#include <string>

#include <glog/logging.h>

#include "engine/kernels/cpu/cpu_ops.h"
#include "engine/kernels/fp8_scaling.h"
#include "engine/runtime/device_context.h"
#if MOE_WITH_CUDA
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/grouped_gemm/grouped_matmul_sm90.h"
#include "engine/kernels/cuda/moe/router_gate.h"
#define MOE_CUDA_OR_FAIL(call) cuda::call
#else
#define MOE_CUDA_OR_FAIL(call) LOG(FATAL) << "this build has no CUDA support"
#endif

#define MOE_DISPATCH(device, fn, ...)    \
  do {                                   \
    if ((device).is_cuda()) {            \
      MOE_CUDA_OR_FAIL(fn(__VA_ARGS__)); \
    } else {                             \
      cpu::fn(__VA_ARGS__);              \
    }                                    \
  } while (0)

namespace moe::ops {
namespace {

// All defined tensors on one device, in device memory; returns that device.
Device CommonDevice(std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    CHECK(t->space() == MemorySpace::kDevice) << "op operand in host memory: " << t->DebugString();
    if (first == nullptr) first = t;
    CHECK(t->device() == first->device())
        << "op operands on different devices: " << first->DebugString() << " vs "
        << t->DebugString();
  }
  CHECK(first != nullptr) << "op without a defined tensor";
  return first->device();
}

void CheckShape(const Tensor& t, const Shape& expected, const char* what) {
  CHECK(t.shape() == expected) << what << " has shape " << ShapeString(t.shape()) << ", expected "
                               << ShapeString(expected);
}

void CheckDType(const Tensor& t, DType expected, const char* what) {
  CHECK(t.dtype() == expected) << what << " is " << t.DebugString() << ", expected "
                               << DTypeName(expected);
}

void CheckFloat(const Tensor& t, const char* what) {
  CHECK(IsFloating(t.dtype())) << what << " must be f32 or bf16: " << t.DebugString();
}

void CheckSameDType(const Tensor& a, const Tensor& b, const char* what) {
  CHECK(a.dtype() == b.dtype()) << what << ": dtypes differ, " << a.DebugString() << " vs "
                                << b.DebugString();
}

int64_t Rows(const Tensor& t) { return t.numel() / t.dim(-1); }

}  // namespace

// ---------------------------------------------------------------- memory and transfers
void Fill(const Tensor& t, float value) { MOE_DISPATCH(CommonDevice({&t}), Fill, t, value); }

void Cast(const Tensor& src, const Tensor& dst) {
  const Device device = CommonDevice({&src, &dst});
  CheckShape(dst, src.shape(), "cast output");
  CheckFloat(src, "cast input");
  CheckFloat(dst, "cast output");
  MOE_DISPATCH(device, Cast, src, dst);
}

void Copy(const Tensor& src, const Tensor& dst) {
  CHECK(src.device().type == dst.device().type)
      << "copy across backends: " << src.DebugString() << " -> " << dst.DebugString();
  CheckShape(dst, src.shape(), "copy destination");
  CheckSameDType(src, dst, "copy");
  const Device device = src.space() == MemorySpace::kDevice ? src.device() : dst.device();
  DeviceContext::Get(device).compute_stream().CopyAsync(dst.data(), src.data(), src.nbytes());
}

void CopyFromHost(const void* src, const Tensor& dst) {
  Stream& stream = DeviceContext::Get(dst.device()).compute_stream();
  stream.CopyAsync(dst.data(), src, dst.nbytes());
  stream.Synchronize();
}

void CopyToHost(const Tensor& src, void* dst) {
  if (src.space() == MemorySpace::kDevice && src.nbytes() <= kSmallReadBytes) {
    MOE_DISPATCH(src.device(), ReadSmallToHost, src, dst);
    return;
  }
  Stream& stream = DeviceContext::Get(src.device()).compute_stream();
  stream.CopyAsync(dst, src.data(), src.nbytes());
  stream.Synchronize();
}

// ---------------------------------------------------------------- elementwise
void Add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const Device device = CommonDevice({&a, &b, &out});
  CheckShape(b, a.shape(), "add operand b");
  CheckShape(out, a.shape(), "add output");
  CheckSameDType(a, b, "add");
  CheckSameDType(a, out, "add");
  CheckFloat(a, "add operand");
  MOE_DISPATCH(device, Add, a, b, out);
}

void Scale(const Tensor& x, float alpha, const Tensor& out) {
  const Device device = CommonDevice({&x, &out});
  CheckShape(out, x.shape(), "scale output");
  CheckSameDType(x, out, "scale");
  CheckFloat(x, "scale input");
  MOE_DISPATCH(device, Scale, x, alpha, out);
}

void Axpy(float alpha, const Tensor& x, const Tensor& y) {
  const Device device = CommonDevice({&x, &y});
  CHECK_EQ(x.numel(), y.numel()) << "axpy: " << x.DebugString() << " into " << y.DebugString();
  CheckFloat(x, "axpy x");
  CheckFloat(y, "axpy y");
  MOE_DISPATCH(device, Axpy, alpha, x, y);
}

// ---------------------------------------------------------------- matmul
void Matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a, bool transpose_b,
            float beta) {
  const Device device = CommonDevice({&a, &b, &out});
  CHECK(a.ndim() == b.ndim() && a.ndim() == out.ndim() && (a.ndim() == 2 || a.ndim() == 3))
      << "matmul takes three 2-D or three 3-D tensors: " << a.DebugString() << ", "
      << b.DebugString() << ", " << out.DebugString();
  const int r = a.ndim() - 2;  // index of the row dimension
  const int64_t m = transpose_a ? a.dim(r + 1) : a.dim(r);
  const int64_t k = transpose_a ? a.dim(r) : a.dim(r + 1);
  const int64_t kb = transpose_b ? b.dim(r + 1) : b.dim(r);
  const int64_t n = transpose_b ? b.dim(r) : b.dim(r + 1);
  CHECK_EQ(k, kb) << "matmul inner dimensions: " << a.DebugString() << " x " << b.DebugString();
  Shape expected = {m, n};
  if (r == 1) {
    CHECK(a.dim(0) == b.dim(0)) << "matmul batch sizes differ";
    expected.insert(expected.begin(), a.dim(0));
  }
  CheckShape(out, expected, "matmul output");
  CheckSameDType(a, b, "matmul");
  CheckFloat(a, "matmul operand");
  // The CPU computes in f32 and also writes bf16 gradients (f32 operands, bf16 out).
  CHECK(out.dtype() == a.dtype() || out.dtype() == DType::kF32 ||
        (!device.is_cuda() && out.dtype() == DType::kBF16))
      << "matmul output " << out.DebugString() << " for " << DTypeName(a.dtype()) << " operands";
  MOE_DISPATCH(device, Matmul, a, b, out, transpose_a, transpose_b, beta);
}

// ---------------------------------------------------------------- grouped GEMM
namespace {
void CheckGroupOffsetValues(std::span<const int32_t> offsets, int64_t groups, int64_t rows,
                            const char* what) {
  CHECK_EQ(static_cast<int64_t>(offsets.size()), groups + 1)
      << what << ": offsets for " << groups << " groups";
  CHECK(offsets.front() == 0 && offsets.back() == rows)
      << what << ": offsets run from " << offsets.front() << " to " << offsets.back()
      << ", expected 0 to " << rows;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    CHECK_LE(offsets[g], offsets[g + 1]) << what << ": offsets decrease after group " << g;
  }
}

// The offsets tensor's shape and dtype; the values wherever the host can see them: host_offsets
// when given, and a CPU tensor's own (which host_offsets must then equal). CUDA kernels check
// device values they read themselves.
void CheckGroupOffsets(const Tensor& offsets, std::span<const int32_t> host_offsets, int64_t groups,
                       int64_t rows, const char* what) {
  CheckShape(offsets, {groups + 1}, what);
  CheckDType(offsets, DType::kI32, what);
  if (!host_offsets.empty()) CheckGroupOffsetValues(host_offsets, groups, rows, what);
  if (offsets.device().is_cuda()) return;
  const std::span<const int32_t> values = offsets.values<int32_t>();
  CheckGroupOffsetValues(values, groups, rows, what);
  CHECK(host_offsets.empty() || std::ranges::equal(host_offsets, values))
      << what << ": host offsets differ from the offsets tensor";
}

// SwiGLU's input: x (rows, 2f) = [gate | up], scale (rows) f32 or undefined.
void CheckSwigluInput(const Tensor& x, const Tensor& scale, const char* what) {
  CheckFloat(x, what);
  CHECK(x.ndim() == 2 && x.dim(1) % 2 == 0)
      << what << ": x must be (rows, 2f): " << x.DebugString();
  if (scale.defined()) {
    CheckShape(scale, {x.dim(0)}, "swiglu scale");
    CheckDType(scale, DType::kF32, "swiglu scale");
  }
}

// SwigluForward's checks: the input, and y (rows, f) of x's dtype.
void CheckSwiglu(const Tensor& x, const Tensor& scale, const Tensor& y, const char* what) {
  CheckSwigluInput(x, scale, what);
  CheckShape(y, {x.dim(0), x.dim(1) / 2}, what);
  CheckSameDType(x, y, what);
}

// SwigluBackward's checks beside dy: the input, dx like x, dscale (rows) f32 or undefined (only
// with scale).
void CheckSwigluGradients(const Tensor& x, const Tensor& scale, const Tensor& dx,
                          const Tensor& dscale, const char* what) {
  CheckSwigluInput(x, scale, what);
  if (dx.defined()) {
    CheckShape(dx, x.shape(), "swiglu dx");
    CheckSameDType(dx, x, what);
  }
  if (dscale.defined()) {
    CHECK(scale.defined()) << what << ": dscale without scale";
    CheckShape(dscale, {x.dim(0)}, "swiglu dscale");
    CheckDType(dscale, DType::kF32, "swiglu dscale");
  }
}

// GroupedMatmul's checks of its inputs; returns the output's shape (rows, n).
Shape CheckGroupedMatmulInputs(const Tensor& x, const Tensor& w, const Tensor& offsets,
                               std::span<const int32_t> host_offsets, bool transpose_w) {
  CHECK(x.ndim() == 2 && w.ndim() == 3)
      << "grouped matmul takes x (rows, k), w (groups, ., .): " << x.DebugString() << ", "
      << w.DebugString();
  const int64_t k = transpose_w ? w.dim(2) : w.dim(1);
  const int64_t n = transpose_w ? w.dim(1) : w.dim(2);
  CHECK_EQ(x.dim(1), k) << "grouped matmul inner dimensions: " << x.DebugString() << " x "
                        << w.DebugString();
  CheckFloat(x, "grouped matmul input");
  CheckSameDType(x, w, "grouped matmul");
  CheckGroupOffsets(offsets, host_offsets, w.dim(0), x.dim(0), "grouped matmul offsets");
  return {x.dim(0), n};
}

// GroupedMatmul's checks; returns the operands' device.
Device CheckGroupedMatmul(const Tensor& x, const Tensor& w, const Tensor& offsets,
                          std::span<const int32_t> host_offsets, const Tensor& y,
                          bool transpose_w) {
  const Device device = CommonDevice({&x, &w, &offsets, &y});
  CheckShape(y, CheckGroupedMatmulInputs(x, w, offsets, host_offsets, transpose_w),
             "grouped matmul output");
  CheckSameDType(x, y, "grouped matmul");
  return device;
}
}  // namespace

void GroupedMatmul(const Tensor& x, const Tensor& w, const Tensor& offsets,
                   std::span<const int32_t> host_offsets, const Tensor& y, bool transpose_w) {
  const Device device = CheckGroupedMatmul(x, w, offsets, host_offsets, y, transpose_w);
  MOE_DISPATCH(device, GroupedMatmul, x, w, offsets, host_offsets, y, transpose_w);
}

void GroupedMatmulSwiglu(const Tensor& x, const Tensor& w, const Tensor& offsets,
                         std::span<const int32_t> host_offsets, const Tensor& scale,
                         const Tensor& h, const Tensor& a) {
  [[maybe_unused]] const Device device =
      CheckGroupedMatmul(x, w, offsets, host_offsets, h, /*transpose_w=*/true);
  CommonDevice({&x, &scale, &a});
  CheckSwiglu(h, scale, a, "grouped matmul swiglu");
#if MOE_WITH_CUDA
  if (device.is_cuda() && cuda::TryGroupedMatmulSwigluSm90(x, w, offsets, scale, h, a)) return;
#endif
  GroupedMatmul(x, w, offsets, host_offsets, h, /*transpose_w=*/true);
  SwigluForward(h, scale, a);
}

void GroupedMatmulSwigluBackward(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                 std::span<const int32_t> host_offsets, const Tensor& h,
                                 const Tensor& scale, const Tensor& dh, const Tensor& dscale) {
  const Device device = CommonDevice({&dy, &w, &offsets, &h, &scale, &dh, &dscale});
  const Shape da_shape =
      CheckGroupedMatmulInputs(dy, w, offsets, host_offsets, /*transpose_w=*/false);
  CHECK(dh.defined()) << "grouped matmul swiglu backward writes dh: it must be given";
  CheckSwigluGradients(h, scale, dh, dscale, "grouped matmul swiglu backward");
  CheckShape(h, {da_shape[0], 2 * da_shape[1]}, "grouped matmul swiglu backward h");
  CheckSameDType(dy, h, "grouped matmul swiglu backward");
#if MOE_WITH_CUDA
  if (device.is_cuda() &&
      cuda::TryGroupedMatmulSwigluBackwardSm90(dy, w, offsets, h, scale, dh, dscale)) {
    return;
  }
#endif
  const Tensor da = Tensor::Empty(da_shape, dy.dtype(), device);
  GroupedMatmul(dy, w, offsets, host_offsets, da, /*transpose_w=*/false);
  SwigluBackward(da, h, scale, dh, dscale);
}

void GroupedMatmulWeightGrad(std::span<const GroupedRows> parts, const Tensor& dw,
                             bool accumulate) {
  CHECK(!parts.empty()) << "grouped weight gradient of no parts";
  for (const GroupedRows& part : parts) {
    const Tensor& dy = part.dy;
    const Tensor& x = part.x;
    CommonDevice({&dy, &x, &part.offsets, &dw});
    CHECK(dy.ndim() == 2 && x.ndim() == 2 && dw.ndim() == 3 && dy.dim(0) == x.dim(0))
        << "grouped weight gradient takes dy (rows, n), x (rows, k), dw (groups, n, k): "
        << dy.DebugString() << ", " << x.DebugString() << ", " << dw.DebugString();
    CheckShape(dw, {dw.dim(0), dy.dim(1), x.dim(1)}, "grouped weight gradient dw");
    CheckFloat(dy, "grouped weight gradient dy");
    CheckSameDType(dy, x, "grouped weight gradient");
    CheckSameDType(dy, parts.front().dy, "grouped weight gradient parts");
    CheckGroupOffsets(part.offsets, part.host_offsets, dw.dim(0), x.dim(0),
                      "grouped weight gradient offsets");
  }
  CheckFloat(dw, "grouped weight gradient dw");
  MOE_DISPATCH(dw.device(), GroupedMatmulWeightGrad, parts, dw, accumulate);
}

bool GroupedMatmulNeedsHostOffsets(Device device, DType dtype, const Shape& weight_shape) {
  CHECK_EQ(weight_shape.size(), 3u)
      << "grouped weights are (groups, r, c), not " << ShapeString(weight_shape);
  if (!device.is_cuda()) return cpu::GroupedMatmulNeedsHostOffsets(device, dtype, weight_shape);
#if MOE_WITH_CUDA
  return cuda::GroupedMatmulNeedsHostOffsets(device, dtype, weight_shape);
#else
  LOG(FATAL) << "this build has no CUDA support";
#endif
}

// ---------------------------------------------------------------- FP8, blockwise scaling
namespace {
// A quantised operand: q (shape) e4m3 and its scales (scales_shape) f32.
void CheckQuantized(const Tensor& q, const Tensor& scales, const Shape& shape,
                    const Shape& scales_shape, const std::string& what) {
  CheckShape(q, shape, (what + " values").c_str());
  CheckDType(q, DType::kE4M3, (what + " values").c_str());
  CheckShape(scales, scales_shape, (what + " scales").c_str());
  CheckDType(scales, DType::kF32, (what + " scales").c_str());
}

// The scales' shape of x (rows, k) in 1 x 128 tiles.
Shape RowTileScalesShape(const Tensor& x, const char* what) {
  CHECK_EQ(x.ndim(), 2) << what << " must be (rows, k): " << x.DebugString();
  return {x.dim(0), Fp8Tiles(x.dim(1))};
}

// The scales' shape of w (groups, n, k) in 128 x 128 blocks.
Shape BlockScalesShape(const Tensor& w, const char* what) {
  CHECK_EQ(w.ndim(), 3) << what << " must be (groups, n, k): " << w.DebugString();
  return {w.dim(0), Fp8Tiles(w.dim(1)), Fp8Tiles(w.dim(2))};
}

// x f32 or bf16 and its quantised form, q (x's shape) and scales (scales_shape), on one device;
// returns it.
Device CheckQuantizedPair(const Tensor& x, const Tensor& q, const Tensor& scales,
                          const Shape& scales_shape, const std::string& what) {
  const Device device = CommonDevice({&x, &q, &scales});
  CheckFloat(x, what.c_str());
  CheckQuantized(q, scales, x.shape(), scales_shape, what);
  return device;
}
}  // namespace

void QuantizeRowTiles(const Tensor& x, const Tensor& q, const Tensor& scales) {
  const Device device = CheckQuantizedPair(
      x, q, scales, RowTileScalesShape(x, "quantize row tiles input"), "quantize row tiles");
  MOE_DISPATCH(device, QuantizeRowTiles, x, q, scales);
}

void QuantizeBlocks(const Tensor& w, const Tensor& q, const Tensor& scales, const Tensor& q_t,
                    const Tensor& scales_t) {
  const Device device = CommonDevice({&w, &q, &scales, &q_t, &scales_t});
  CheckFloat(w, "quantize blocks input");
  Shape shape = w.shape(), scales_shape = BlockScalesShape(w, "quantize blocks input");
  CheckQuantized(q, scales, shape, scales_shape, "quantize blocks");
  CHECK_EQ(q_t.defined(), scales_t.defined())
      << "quantize blocks: the transposed values and scales go together";
  if (q_t.defined()) {
    std::swap(shape[1], shape[2]);
    std::swap(scales_shape[1], scales_shape[2]);
    CheckQuantized(q_t, scales_t, shape, scales_shape, "quantize blocks transposed");
  }
  MOE_DISPATCH(device, QuantizeBlocks, w, q, scales, q_t, scales_t);
}

void DequantizeRowTiles(const Tensor& q, const Tensor& scales, const Tensor& x) {
  const Device device = CheckQuantizedPair(
      x, q, scales, RowTileScalesShape(x, "dequantize row tiles output"), "dequantize row tiles");
  MOE_DISPATCH(device, DequantizeRowTiles, q, scales, x);
}

void DequantizeBlocks(const Tensor& q, const Tensor& scales, const Tensor& w) {
  const Device device = CheckQuantizedPair(
      w, q, scales, BlockScalesShape(w, "dequantize blocks output"), "dequantize blocks");
  MOE_DISPATCH(device, DequantizeBlocks, q, scales, w);
}

void Fp8GroupedMatmul(const Tensor& xq, const Tensor& x_scales, const Tensor& wq,
                      const Tensor& w_scales, const Tensor& offsets, const Tensor& y) {
  const Device device = CommonDevice({&xq, &x_scales, &wq, &w_scales, &offsets, &y});
  CheckQuantized(wq, w_scales, wq.shape(), BlockScalesShape(wq, "fp8 grouped matmul weights"),
                 "fp8 grouped matmul weights");
  const int64_t contracted = wq.dim(2), n = wq.dim(1);
  CHECK(xq.ndim() == 2 && xq.dim(1) == contracted)
      << "fp8 grouped matmul inner dimensions: " << xq.DebugString() << " x " << wq.DebugString();
  CheckQuantized(xq, x_scales, xq.shape(), RowTileScalesShape(xq, "fp8 grouped matmul input"),
                 "fp8 grouped matmul input");
  CheckGroupOffsets(offsets, {}, wq.dim(0), xq.dim(0), "fp8 grouped matmul offsets");
  CheckFloat(y, "fp8 grouped matmul output");
  CheckShape(y, {xq.dim(0), n}, "fp8 grouped matmul output");
  MOE_DISPATCH(device, Fp8GroupedMatmul, xq, x_scales, wq, w_scales, offsets, y);
}

namespace {
// QuantizeColumnTiles' forms of grouped rows (rows, cols) over `groups` groups.
void CheckColumnTiles(const Tensor& q, const Tensor& scales, int64_t groups, int64_t rows,
                      int64_t cols, const std::string& what) {
  CheckQuantized(q, scales, {cols, Fp8ColumnTokens(groups, rows)},
                 {Fp8ColumnTileSlots(groups, rows), cols}, what);
}

// The FP8 forms an op writes of grouped rows (rows, k) over `offsets`: the column tiles (q,
// scales) and the row tiles (row_q, row_scales), each pair whole or left out, not both.
void CheckFp8Forms(const Tensor& offsets, int64_t rows, int64_t k, const Tensor& q,
                   const Tensor& scales, const Tensor& row_q, const Tensor& row_scales,
                   const std::string& what) {
  const int64_t groups = offsets.numel() - 1;
  CheckGroupOffsets(offsets, {}, groups, rows, (what + " offsets").c_str());
  CHECK(q.defined() || row_q.defined()) << what << ": no output";
  CHECK_EQ(q.defined(), scales.defined()) << what << ": column tiles take both values and scales";
  CHECK_EQ(row_q.defined(), row_scales.defined())
      << what << ": row tiles take both values and scales";
  if (q.defined()) CheckColumnTiles(q, scales, groups, rows, k, what);
  if (row_q.defined()) {
    CheckQuantized(row_q, row_scales, {rows, k}, {rows, Fp8Tiles(k)}, what + " row tiles");
  }
}
}  // namespace

void QuantizeColumnTiles(const Tensor& x, const Tensor& offsets, const Tensor& q,
                         const Tensor& scales, const Tensor& row_q, const Tensor& row_scales,
                         const Tensor& index) {
  const Device device = CommonDevice({&x, &offsets, &q, &scales, &row_q, &row_scales, &index});
  CheckFloat(x, "quantize column tiles input");
  CHECK_EQ(x.ndim(), 2) << "quantize column tiles input must be (rows, k): " << x.DebugString();
  int64_t rows = x.dim(0);
  if (index.defined()) {
    CheckDType(index, DType::kI32, "quantize column tiles index");
    CHECK_EQ(index.ndim(), 1) << "quantize column tiles index must be (rows): "
                              << index.DebugString();
    rows = index.dim(0);
  }
  CHECK(q.defined()) << "quantize column tiles writes the column tiles: q must be given";
  CheckFp8Forms(offsets, rows, x.dim(1), q, scales, row_q, row_scales, "quantize column tiles");
  MOE_DISPATCH(device, QuantizeColumnTiles, x, offsets, q, scales, row_q, row_scales, index);
}

void SwigluForwardQuantized(const Tensor& h, const Tensor& scale, const Tensor& offsets,
                            const Tensor& q, const Tensor& scales, const Tensor& row_q,
                            const Tensor& row_scales) {
  const Device device = CommonDevice({&h, &scale, &offsets, &q, &scales, &row_q, &row_scales});
  CheckSwigluInput(h, scale, "swiglu quantized input");
  CheckFp8Forms(offsets, h.dim(0), h.dim(1) / 2, q, scales, row_q, row_scales, "swiglu quantized");
  MOE_DISPATCH(device, SwigluForwardQuantized, h, scale, offsets, q, scales, row_q, row_scales);
}

void SwigluBackwardQuantized(const Tensor& da, const Tensor& h, const Tensor& scale,
                             const Tensor& offsets, const Tensor& q, const Tensor& scales,
                             const Tensor& row_q, const Tensor& row_scales, const Tensor& dscale) {
  const Device device =
      CommonDevice({&da, &h, &scale, &offsets, &q, &scales, &row_q, &row_scales, &dscale});
  CheckSwiglu(h, scale, da, "swiglu backward quantized");
  CheckSwigluGradients(h, scale, Tensor(), dscale, "swiglu backward quantized");
  CHECK(q.defined() && row_q.defined())
      << "swiglu backward quantized writes both tile forms: both must be given";
  CheckFp8Forms(offsets, h.dim(0), h.dim(1), q, scales, row_q, row_scales,
                "swiglu backward quantized");
  MOE_DISPATCH(device, SwigluBackwardQuantized, da, h, scale, offsets, q, scales, row_q, row_scales,
               dscale);
}

void Fp8GroupedMatmulWeightGrad(std::span<const Fp8GroupedColumns> parts, const Tensor& dw,
                                bool accumulate) {
  CHECK(!parts.empty()) << "fp8 grouped weight gradient needs at least one part";
  CHECK_EQ(dw.ndim(), 3) << "fp8 grouped weight gradient dw must be (groups, n, k): "
                         << dw.DebugString();
  CheckFloat(dw, "fp8 grouped weight gradient dw");
  const int64_t groups = dw.dim(0), n = dw.dim(1), k = dw.dim(2);
  for (const Fp8GroupedColumns& part : parts) {
    CommonDevice({&part.dy_q, &part.dy_scales, &part.x_q, &part.x_scales, &part.offsets, &dw});
    CheckColumnTiles(part.dy_q, part.dy_scales, groups, part.rows, n,
                     "fp8 grouped weight gradient dy");
    CheckColumnTiles(part.x_q, part.x_scales, groups, part.rows, k,
                     "fp8 grouped weight gradient x");
    CheckGroupOffsets(part.offsets, {}, groups, part.rows, "fp8 grouped weight gradient offsets");
  }
  MOE_DISPATCH(dw.device(), Fp8GroupedMatmulWeightGrad, parts, dw, accumulate);
}

// ---------------------------------------------------------------- normalisation
void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd, const Tensor& residual) {
  const Device device = CommonDevice({&x, &weight, &y, &rstd, &residual});
  CheckFloat(x, "rmsnorm input");
  if (residual.defined()) {
    CheckShape(residual, x.shape(), "rmsnorm residual");
    CheckSameDType(x, residual, "rmsnorm forward");
  }
  CheckFloat(weight, "rmsnorm weight");
  CheckShape(weight, {x.dim(-1)}, "rmsnorm weight");
  CheckShape(y, x.shape(), "rmsnorm output");
  CheckSameDType(x, y, "rmsnorm");
  CheckShape(rstd, {Rows(x)}, "rmsnorm rstd");
  CheckDType(rstd, DType::kF32, "rmsnorm rstd");
  MOE_DISPATCH(device, RmsNormForward, x, weight, eps, y, rstd, residual);
}

void RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                     const Tensor& dx, const Tensor& dweight, const Tensor& residual) {
  const Device device = CommonDevice({&dy, &x, &weight, &rstd, &dx, &dweight, &residual});
  if (residual.defined()) {
    CheckShape(residual, x.shape(), "rmsnorm residual");
    CheckSameDType(x, residual, "rmsnorm backward");
  }
  CheckShape(dy, x.shape(), "rmsnorm dy");
  CheckShape(dx, x.shape(), "rmsnorm dx");
  CheckSameDType(x, dy, "rmsnorm backward");
  CheckSameDType(x, dx, "rmsnorm backward");
  CheckShape(weight, {x.dim(-1)}, "rmsnorm weight");
  CheckShape(dweight, {x.dim(-1)}, "rmsnorm dweight");
  CheckFloat(dweight, "rmsnorm dweight");
  CheckShape(rstd, {Rows(x)}, "rmsnorm rstd");
  CheckDType(rstd, DType::kF32, "rmsnorm rstd");
  MOE_DISPATCH(device, RmsNormBackward, dy, x, weight, rstd, dx, dweight, residual);
}

void SoftmaxForward(const Tensor& x, const Tensor& y) {
  const Device device = CommonDevice({&x, &y});
  CheckFloat(x, "softmax input");
  CheckShape(y, x.shape(), "softmax output");
  CheckSameDType(x, y, "softmax");
  MOE_DISPATCH(device, SoftmaxForward, x, y);
}

void SoftmaxBackward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  const Device device = CommonDevice({&dy, &y, &dx});
  CheckShape(dy, y.shape(), "softmax dy");
  CheckShape(dx, y.shape(), "softmax dx");
  CheckSameDType(dy, y, "softmax backward");
  CheckSameDType(dx, y, "softmax backward");
  MOE_DISPATCH(device, SoftmaxBackward, dy, y, dx);
}

// ---------------------------------------------------------------- activations
void SiluForward(const Tensor& x, const Tensor& y) {
  const Device device = CommonDevice({&x, &y});
  CheckFloat(x, "silu input");
  CheckShape(y, x.shape(), "silu output");
  CheckSameDType(x, y, "silu");
  MOE_DISPATCH(device, SiluForward, x, y);
}

void SiluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const Device device = CommonDevice({&dy, &x, &dx});
  CheckShape(dy, x.shape(), "silu dy");
  CheckShape(dx, x.shape(), "silu dx");
  CheckSameDType(dy, x, "silu backward");
  CheckSameDType(dx, x, "silu backward");
  MOE_DISPATCH(device, SiluBackward, dy, x, dx);
}

void SwigluForward(const Tensor& x, const Tensor& scale, const Tensor& y) {
  const Device device = CommonDevice({&x, &scale, &y});
  CheckSwiglu(x, scale, y, "swiglu forward");
  MOE_DISPATCH(device, SwigluForward, x, scale, y);
}

void SwigluBackward(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& dx,
                    const Tensor& dscale) {
  const Device device = CommonDevice({&dy, &x, &scale, &dx, &dscale});
  CheckSwiglu(x, scale, dy, "swiglu backward");
  CheckSwigluGradients(x, scale, dx, dscale, "swiglu backward");
  MOE_DISPATCH(device, SwigluBackward, dy, x, scale, dx, dscale);
}

// ---------------------------------------------------------------- rotary position embedding
namespace {
void CheckRopeTable(const Tensor& table) {
  CheckDType(table, DType::kF32, "rope table");
  CHECK(table.ndim() == 3 && table.dim(0) > 0 && table.dim(1) > 0 && table.dim(2) == 2)
      << "rope table must be (seq, head_dim / 2, 2): " << table.DebugString();
}

// x (tokens, heads, head_dim) against the table, as the rotations read them; an undefined table
// passes (an unrotated move of heads).
void CheckRopeHeads(const Tensor& x, const Tensor& table) {
  CheckFloat(x, "rope heads");
  CHECK(x.ndim() == 3 && x.dim(2) % 2 == 0)
      << "rope takes (tokens, heads, even head_dim): " << x.DebugString();
  if (!table.defined()) return;
  CheckRopeTable(table);
  CHECK(table.dim(1) == x.dim(2) / 2)
      << "rope table " << table.DebugString() << " is not for head_dim " << x.dim(2);
  CHECK(x.dim(0) % table.dim(0) == 0)
      << "rope: tokens " << x.dim(0) << " not a multiple of seq " << table.dim(0);
}

// qkv (tokens, (heads + 2 kv_heads) head_dim) against q (tokens, heads, head_dim) and k, v (tokens,
// kv_heads, head_dim), as RopeQkvForward takes them and RopeQkvBackward their gradients.
void CheckRopeQkv(const Tensor& qkv, const Tensor& table, const Tensor& q, const Tensor& k,
                  const Tensor& v) {
  CheckFloat(qkv, "rope qkv");
  CheckRopeHeads(q, table);
  const int64_t tokens = q.dim(0), heads = q.dim(1), d = q.dim(2);
  CHECK(k.ndim() == 3 && k.dim(0) == tokens && k.dim(2) == d)
      << "rope k " << k.DebugString() << " does not go with q " << q.DebugString();
  CheckShape(v, k.shape(), "rope v");
  CheckShape(qkv, {tokens, (heads + 2 * k.dim(1)) * d}, "rope qkv");
  for (const Tensor* t : {&q, &k, &v}) CheckSameDType(qkv, *t, "rope qkv");
}

// x and y (tokens, heads, head_dim) of one shape and dtype, as RopeForward and RopeBackward take
// them; the table defined.
void CheckRope(const Tensor& x, const Tensor& table, const Tensor& y) {
  CHECK(table.defined()) << "rope without a table";
  CheckRopeHeads(x, table);
  CheckShape(y, x.shape(), "rope output");
  CheckSameDType(x, y, "rope");
}
}  // namespace

void RopeTable(float base, const Tensor& table) {
  const Device device = CommonDevice({&table});
  CheckRopeTable(table);
  MOE_DISPATCH(device, RopeTable, base, table);
}

void RopeQkvForward(const Tensor& qkv, const Tensor& table, const Tensor& q, const Tensor& k,
                    const Tensor& v) {
  const Device device = CommonDevice({&qkv, &table, &q, &k, &v});
  CheckRopeQkv(qkv, table, q, k, v);
  MOE_DISPATCH(device, RopeQkvForward, qkv, table, q, k, v);
}

void RopeQkvBackward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& table,
                     const Tensor& dqkv) {
  const Device device = CommonDevice({&dq, &dk, &dv, &table, &dqkv});
  CheckRopeQkv(dqkv, table, dq, dk, dv);
  MOE_DISPATCH(device, RopeQkvBackward, dq, dk, dv, table, dqkv);
}

void RopeForward(const Tensor& x, const Tensor& table, const Tensor& y) {
  const Device device = CommonDevice({&x, &table, &y});
  CheckRope(x, table, y);
  MOE_DISPATCH(device, RopeForward, x, table, y);
}

void RopeBackward(const Tensor& dy, const Tensor& table, const Tensor& dx) {
  const Device device = CommonDevice({&dy, &table, &dx});
  CheckRope(dy, table, dx);
  MOE_DISPATCH(device, RopeBackward, dy, table, dx);
}

// ---------------------------------------------------------------- attention
namespace {
void CheckAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse) {
  CheckFloat(q, "attention q");
  CHECK(q.ndim() == 4) << "attention q must be (batch, seq, heads, d): " << q.DebugString();
  const int64_t batch = q.dim(0), seq = q.dim(1), heads = q.dim(2), d = q.dim(3);
  CHECK(k.ndim() == 4 && k.dim(0) == batch && k.dim(1) == seq && k.dim(3) == d)
      << "attention k " << k.DebugString() << " for q " << q.DebugString();
  CHECK(k.dim(2) > 0 && heads % k.dim(2) == 0)
      << "attention heads " << heads << " not a multiple of kv heads " << k.dim(2);
  CheckShape(v, k.shape(), "attention v");
  CheckShape(out, q.shape(), "attention out");
  CheckSameDType(q, k, "attention");
  CheckSameDType(q, v, "attention");
  CheckSameDType(q, out, "attention");
  CheckShape(lse, {batch, heads, seq}, "attention lse");
  CheckDType(lse, DType::kF32, "attention lse");
}
}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse) {
  const Device device = CommonDevice({&q, &k, &v, &out, &lse});
  CheckAttention(q, k, v, out, lse);
  MOE_DISPATCH(device, AttentionForward, q, k, v, out, lse);
}

void AttentionBackward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                       const Tensor& dv) {
  const Device device = CommonDevice({&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv});
  CheckAttention(q, k, v, out, lse);
  CheckShape(dout, q.shape(), "attention dout");
  CheckShape(dq, q.shape(), "attention dq");
  CheckShape(dk, k.shape(), "attention dk");
  CheckShape(dv, v.shape(), "attention dv");
  for (const Tensor* t : {&dout, &dq, &dk, &dv}) CheckSameDType(*t, q, "attention backward");
  MOE_DISPATCH(device, AttentionBackward, dout, q, k, v, out, lse, dq, dk, dv);
}

// ---------------------------------------------------------------- embedding
void EmbeddingForward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const Device device = CommonDevice({&ids, &table, &out});
  CheckDType(ids, DType::kI32, "embedding ids");
  CHECK(ids.ndim() == 1 && table.ndim() == 2) << "embedding ids (tokens), table (vocab, h)";
  CheckShape(out, {ids.dim(0), table.dim(1)}, "embedding output");
  CheckFloat(table, "embedding table");
  CheckSameDType(table, out, "embedding");
  MOE_DISPATCH(device, EmbeddingForward, ids, table, out);
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const Device device = CommonDevice({&ids, &dout, &dtable});
  CheckDType(ids, DType::kI32, "embedding ids");
  CHECK(ids.ndim() == 1 && dtable.ndim() == 2) << "embedding ids (tokens), dtable (vocab, h)";
  CheckShape(dout, {ids.dim(0), dtable.dim(1)}, "embedding dout");
  CheckFloat(dout, "embedding dout");
  CheckFloat(dtable, "embedding dtable");
  MOE_DISPATCH(device, EmbeddingBackward, ids, dout, dtable);
}

// ---------------------------------------------------------------- loss
namespace {
void CheckLogitsAndTargets(const Tensor& logits, const Tensor& targets) {
  CheckFloat(logits, "cross-entropy logits");
  CHECK_EQ(logits.ndim(), 2) << "cross-entropy logits (tokens, vocab)";
  CheckShape(targets, {logits.dim(0)}, "cross-entropy targets");
  CheckDType(targets, DType::kI32, "cross-entropy targets");
}

// A (tokens) f32 tensor of one value per row of logits (losses, lse).
void CheckPerToken(const Tensor& t, const Tensor& logits, const char* name) {
  CheckShape(t, {logits.dim(0)}, name);
  CheckDType(t, DType::kF32, name);
}

void CheckLogitsGrad(const Tensor& logits, const Tensor& dlogits) {
  CheckShape(dlogits, logits.shape(), "cross-entropy dlogits");
  CheckSameDType(logits, dlogits, "cross-entropy dlogits");
}
}  // namespace

void CrossEntropyForward(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                         const Tensor& lse) {
  const Device device = CommonDevice({&logits, &targets, &losses, &lse});
  CheckLogitsAndTargets(logits, targets);
  CheckPerToken(losses, logits, "cross-entropy losses");
  CheckPerToken(lse, logits, "cross-entropy lse");
  MOE_DISPATCH(device, CrossEntropyForward, logits, targets, losses, lse);
}

void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                          float grad_scale, const Tensor& dlogits) {
  const Device device = CommonDevice({&logits, &targets, &lse, &dlogits});
  CheckLogitsAndTargets(logits, targets);
  CheckPerToken(lse, logits, "cross-entropy lse");
  CheckLogitsGrad(logits, dlogits);
  MOE_DISPATCH(device, CrossEntropyBackward, logits, targets, lse, grad_scale, dlogits);
}

void CrossEntropyForwardBackward(const Tensor& logits, const Tensor& targets, float grad_scale,
                                 const Tensor& losses, const Tensor& lse, const Tensor& dlogits) {
  const Device device = CommonDevice({&logits, &targets, &losses, &lse, &dlogits});
  CheckLogitsAndTargets(logits, targets);
  CheckPerToken(losses, logits, "cross-entropy losses");
  CheckPerToken(lse, logits, "cross-entropy lse");
  CheckLogitsGrad(logits, dlogits);
  MOE_DISPATCH(device, CrossEntropyForwardBackward, logits, targets, grad_scale, losses, lse,
               dlogits);
}

// ---------------------------------------------------------------- routing
void TopK(const Tensor& x, const Tensor& values, const Tensor& indices) {
  const Device device = CommonDevice({&x, &values, &indices});
  CheckDType(x, DType::kF32, "topk input");
  CHECK_EQ(x.ndim(), 2) << "topk input (rows, cols)";
  CHECK(values.ndim() == 2 && values.dim(0) == x.dim(0) && values.dim(1) >= 1 &&
        values.dim(1) <= x.dim(1))
      << "topk values " << values.DebugString() << " for " << x.DebugString();
  CheckDType(values, DType::kF32, "topk values");
  CheckShape(indices, values.shape(), "topk indices");
  CheckDType(indices, DType::kI32, "topk indices");
  MOE_DISPATCH(device, TopK, x, values, indices);
}

void TopKBackward(const Tensor& dvalues, const Tensor& indices, const Tensor& dx) {
  const Device device = CommonDevice({&dvalues, &indices, &dx});
  CheckDType(dvalues, DType::kF32, "topk dvalues");
  CheckShape(indices, dvalues.shape(), "topk indices");
  CheckDType(indices, DType::kI32, "topk indices");
  CHECK(dx.ndim() == 2 && dx.dim(0) == dvalues.dim(0)) << "topk dx " << dx.DebugString();
  CheckDType(dx, DType::kF32, "topk dx");
  MOE_DISPATCH(device, TopKBackward, dvalues, indices, dx);
}

void SortByKey(const Tensor& keys, int64_t num_keys, const Tensor& order, const Tensor& offsets) {
  const Device device = CommonDevice({&keys, &order, &offsets});
  CheckDType(keys, DType::kI32, "sort keys");
  CHECK_EQ(keys.ndim(), 1) << "sort keys (n)";
  CHECK_GT(num_keys, 0);
  CheckShape(order, keys.shape(), "sort order");
  CheckDType(order, DType::kI32, "sort order");
  CheckShape(offsets, {num_keys + 1}, "sort offsets");
  CheckDType(offsets, DType::kI32, "sort offsets");
  MOE_DISPATCH(device, SortByKey, keys, num_keys, order, offsets);
}

void GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const Device device = CommonDevice({&x, &index, &out});
  CHECK(x.ndim() == 2 && index.ndim() == 1) << "gather x (n, h), index (m)";
  CheckDType(index, DType::kI32, "gather index");
  CheckShape(out, {index.dim(0), x.dim(1)}, "gather output");
  CheckSameDType(x, out, "gather");
  MOE_DISPATCH(device, GatherRows, x, index, out);
}

void GatherSumRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const Device device = CommonDevice({&x, &index, &out});
  CHECK(x.ndim() == 2 && index.ndim() == 2) << "gather-sum x (n, h), index (m, k)";
  CheckDType(index, DType::kI32, "gather-sum index");
  CheckShape(out, {index.dim(0), x.dim(1)}, "gather-sum output");
  CheckSameDType(x, out, "gather-sum");
  CheckFloat(x, "gather-sum input");
  MOE_DISPATCH(device, GatherSumRows, x, index, out);
}

// ---------------------------------------------------------------- reductions
void Sum(const Tensor& x, const Tensor& out) {
  const Device device = CommonDevice({&x, &out});
  CheckFloat(x, "sum input");
  CheckShape(out, {1}, "sum output");
  CheckDType(out, DType::kF32, "sum output");
  MOE_DISPATCH(device, Sum, x, out);
}

void GlobalL2Norm(std::span<const Tensor> xs, const Tensor& out) {
  const Device device = CommonDevice({&out});
  for (const Tensor& x : xs) {
    CHECK(x.device() == device) << "l2 norm over devices: " << x.DebugString();
    CheckFloat(x, "l2 norm input");
  }
  CheckShape(out, {1}, "l2 norm output");
  CheckDType(out, DType::kF32, "l2 norm output");
  MOE_DISPATCH(device, GlobalL2Norm, xs, out);
}

// ---------------------------------------------------------------- optimizer
void AdamWUpdate(std::span<const AdamWTensors> entries, const AdamWConfig& config) {
  if (entries.empty()) return;
  CHECK_GE(config.step, 1) << "adamw step is 1-based";
  const AdamWTensors& first = entries.front();
  const Device device = CommonDevice({&first.master});
  // grad, m, v and the model copy: each a float dtype, the same over all entries.
  const auto check_float_as_first = [](const Tensor& t, const Tensor& in_first, const char* what) {
    CheckFloat(t, what);
    CheckDType(t, in_first.dtype(), what);
  };
  for (const AdamWTensors& e : entries) {
    CHECK(CommonDevice({&e.master, &e.grad, &e.m, &e.v, &e.model}) == device)
        << "adamw over devices: " << e.master.DebugString();
    for (const Tensor* t : {&e.grad, &e.m, &e.v}) {
      CHECK_EQ(t->numel(), e.master.numel()) << "adamw sizes differ";
    }
    CheckDType(e.master, DType::kF32, "adamw master");
    check_float_as_first(e.grad, first.grad, "adamw grad");
    check_float_as_first(e.m, first.m, "adamw m");
    check_float_as_first(e.v, first.v, "adamw v");
    CHECK_EQ(e.model.defined(), first.model.defined()) << "adamw: some model copies missing";
    if (e.model.defined()) {
      check_float_as_first(e.model, first.model, "adamw model copy");
      CHECK_EQ(e.model.numel(), e.master.numel()) << "adamw model copy size";
    }
  }
  MOE_DISPATCH(device, AdamWUpdate, entries, config);
}

// ---------------------------------------------------------------- MoE router
namespace {
void CheckRouterMatrix(const Tensor& t, const char* what) {
  CHECK_EQ(t.ndim(), 2) << what << " must be (rows, cols): " << t.DebugString();
  CheckDType(t, DType::kF32, what);
}

// A router's top-k values (tokens, k) f32 and indices (tokens, k) i32 over its probabilities or
// logits (tokens, experts), 1 <= k <= experts.
void CheckRouterTopK(const Tensor& values, const Tensor& indices, const Tensor& probs) {
  CheckRouterMatrix(values, "router top-k values");
  CHECK(values.dim(0) == probs.dim(0) && values.dim(1) >= 1 && values.dim(1) <= probs.dim(1))
      << "router top-k values " << values.DebugString() << " for " << probs.DebugString();
  CheckShape(indices, values.shape(), "router top-k indices");
  CheckDType(indices, DType::kI32, "router top-k indices");
}
}  // namespace

void NormalizeRowsForward(const Tensor& x, const Tensor& y) {
  const Device device = CommonDevice({&x, &y});
  CheckRouterMatrix(x, "normalize input");
  CheckShape(y, x.shape(), "normalize output");
  CheckDType(y, DType::kF32, "normalize output");
  MOE_DISPATCH(device, NormalizeRowsForward, x, y);
}

void NormalizeRowsBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const Device device = CommonDevice({&dy, &x, &dx});
  CheckRouterMatrix(x, "normalize input");
  CheckShape(dy, x.shape(), "normalize dy");
  CheckShape(dx, x.shape(), "normalize dx");
  CheckDType(dy, DType::kF32, "normalize dy");
  CheckDType(dx, DType::kF32, "normalize dx");
  MOE_DISPATCH(device, NormalizeRowsBackward, dy, x, dx);
}

void LoadBalancingLossForward(const Tensor& probs, const Tensor& offsets, int64_t topk,
                              const Tensor& loss) {
  const Device device = CommonDevice({&probs, &offsets, &loss});
  CheckRouterMatrix(probs, "load-balancing probs");
  CheckShape(offsets, {probs.dim(1) + 1}, "load-balancing offsets");
  CheckDType(offsets, DType::kI32, "load-balancing offsets");
  CheckShape(loss, {1}, "load-balancing loss");
  CheckDType(loss, DType::kF32, "load-balancing loss");
  CHECK_GE(topk, 1);
  MOE_DISPATCH(device, LoadBalancingLossForward, probs, offsets, topk, loss);
}

void LoadBalancingLossBackward(const Tensor& offsets, int64_t topk, float grad,
                               const Tensor& dprobs) {
  const Device device = CommonDevice({&offsets, &dprobs});
  CheckRouterMatrix(dprobs, "load-balancing dprobs");
  CheckShape(offsets, {dprobs.dim(1) + 1}, "load-balancing offsets");
  CheckDType(offsets, DType::kI32, "load-balancing offsets");
  CHECK_GE(topk, 1);
  MOE_DISPATCH(device, LoadBalancingLossBackward, offsets, topk, grad, dprobs);
}

void ZLossForward(const Tensor& logits, const Tensor& loss) {
  const Device device = CommonDevice({&logits, &loss});
  CheckRouterMatrix(logits, "z-loss logits");
  CheckShape(loss, {1}, "z-loss output");
  CheckDType(loss, DType::kF32, "z-loss output");
  MOE_DISPATCH(device, ZLossForward, logits, loss);
}

void ZLossBackward(const Tensor& logits, float grad, const Tensor& dlogits) {
  const Device device = CommonDevice({&logits, &dlogits});
  CheckRouterMatrix(logits, "z-loss logits");
  CheckShape(dlogits, logits.shape(), "z-loss dlogits");
  CheckDType(dlogits, DType::kF32, "z-loss dlogits");
  MOE_DISPATCH(device, ZLossBackward, logits, grad, dlogits);
}

void RouterGateForward(const Tensor& logits, bool renormalize, const Tensor& probs,
                       const Tensor& values, const Tensor& weights, const Tensor& indices) {
  [[maybe_unused]] const Device device =
      CommonDevice({&logits, &probs, &values, &weights, &indices});
  CheckRouterMatrix(logits, "router logits");
  CheckShape(probs, logits.shape(), "router probs");
  CheckDType(probs, DType::kF32, "router probs");
  CheckRouterTopK(values, indices, logits);
  CheckShape(weights, values.shape(), "router weights");
  CheckDType(weights, DType::kF32, "router weights");
#if MOE_WITH_CUDA
  if (device.is_cuda() &&
      cuda::TryRouterGateForward(logits, renormalize, probs, values, weights, indices)) {
    return;
  }
#endif
  SoftmaxForward(logits, probs);
  TopK(probs, values, indices);
  if (renormalize) {
    NormalizeRowsForward(values, weights);
  } else {
    Copy(values, weights);
  }
}

void RouterGateBackward(const Tensor& dweights, const Tensor& values, const Tensor& indices,
                        const Tensor& probs, const Tensor& offsets, float balance_grad,
                        bool renormalize, const Tensor& dlogits) {
  const Device device = CommonDevice({&dweights, &values, &indices, &probs, &offsets, &dlogits});
  CheckRouterMatrix(probs, "router probs");
  CheckRouterTopK(values, indices, probs);
  CheckShape(dweights, values.shape(), "router dweights");
  CheckDType(dweights, DType::kF32, "router dweights");
  CheckShape(offsets, {probs.dim(1) + 1}, "router offsets");
  CheckDType(offsets, DType::kI32, "router offsets");
  CheckShape(dlogits, probs.shape(), "router dlogits");
  CheckFloat(dlogits, "router dlogits");
#if MOE_WITH_CUDA
  if (device.is_cuda() && cuda::TryRouterGateBackward(dweights, values, indices, probs, offsets,
                                                      balance_grad, renormalize, dlogits)) {
    return;
  }
#endif
  Tensor dvalues = dweights;
  if (renormalize) {
    dvalues = Tensor::Empty(values.shape(), DType::kF32, device);
    NormalizeRowsBackward(dweights, values, dvalues);
  }
  Tensor dprobs = Tensor::Empty(probs.shape(), DType::kF32, device);
  TopKBackward(dvalues, indices, dprobs);
  LoadBalancingLossBackward(offsets, values.dim(1), balance_grad, dprobs);
  const bool f32 = dlogits.dtype() == DType::kF32;
  const Tensor dlogits_f32 = f32 ? dlogits : Tensor::Empty(probs.shape(), DType::kF32, device);
  SoftmaxBackward(dprobs, probs, dlogits_f32);
  if (!f32) Cast(dlogits_f32, dlogits);
}

void InvertPermutation(const Tensor& order, int64_t topk, const Tensor& source_rows,
                       const Tensor& inverse) {
  const Device device = CommonDevice({&order, &source_rows, &inverse});
  CheckDType(order, DType::kI32, "permutation");
  CHECK_EQ(order.ndim(), 1) << "permutation (n)";
  CHECK(topk >= 1 && order.dim(0) % topk == 0)
      << "permutation of " << order.dim(0) << " entries with topk " << topk;
  CheckShape(source_rows, order.shape(), "permutation source rows");
  CheckShape(inverse, order.shape(), "permutation inverse");
  CheckDType(source_rows, DType::kI32, "permutation source rows");
  CheckDType(inverse, DType::kI32, "permutation inverse");
  MOE_DISPATCH(device, InvertPermutation, order, topk, source_rows, inverse);
}

}  // namespace moe::ops
