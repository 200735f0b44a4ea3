// The ops API: every numerical operation the trainer needs, forward and backward, on both
// backends. Modules call only these. Each op dispatches on its tensors' device; all tensors of
// one call live on the same device (Copy excepted). Shapes and dtypes are checked (CHECK: a
// mismatch is a programmer error). Ops run on the device's compute stream.
//
// Backends:
// - CPU (Eigen and plain loops): the reference. Float tensors must be f32. Deterministic.
// - CUDA (cuBLAS and kernels in cuda/): float tensors may be f32 or bf16 (each op says which may
//   mix); arithmetic accumulates in fp32. Results are deterministic run to run (no float atomics).
//
// Conventions: `out`, `y`, `dx`... are written (=) unless the comment says += (accumulated).
// Statistics saved for backward (rstd, lse) are always f32. Index tensors are i32.
// Shapes in comments: (rows, cols) etc.; "rows" is any leading size.
#pragma once

#include <cstdint>
#include <span>

#include "engine/core/tensor.h"

namespace moe::ops {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: master -= lr * wd * master
  int64_t step = 1;           // 1-based, for bias correction
  float grad_scale = 1.0f;    // gradients are multiplied by this first (clipping)
};

// One parameter's tensors for AdamWUpdate.
struct AdamWTensors {
  Tensor master;  // (n) f32
  Tensor grad;    // (n) f32 or bf16
  Tensor m, v;    // (n) f32 or bf16 (AdamW's first and second moments)
  Tensor model;   // undefined, or (n) f32 / bf16: receives the new master values
  bool weight_decay = true;
};

// One part of a grouped weight gradient's token rows (GroupedMatmulWeightGrad): dy (rows, n), x
// (rows, k), the group offsets (groups + 1) and, where needed, their host copy.
struct GroupedRows {
  Tensor dy;
  Tensor x;
  Tensor offsets;
  std::span<const int32_t> host_offsets;
};

// One part of an FP8 weight gradient's token rows (Fp8GroupedMatmulWeightGrad):
// QuantizeColumnTiles' forms of dy (rows, n) and x (rows, k), both over `offsets` (groups + 1, on
// the op's device).
struct Fp8GroupedColumns {
  // dy_q (n, Fp8ColumnTokens(groups, rows)) e4m3, dy_scales (Fp8ColumnTileSlots(groups, rows), n);
  // x_q and x_scales the same with k.
  Tensor dy_q, dy_scales;
  Tensor x_q, x_scales;
  Tensor offsets;
  int64_t rows = 0;
};

#include "engine/kernels/op_declarations.inc"

// GroupedMatmulWeightGrad of one part.
inline void GroupedMatmulWeightGrad(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    std::span<const int32_t> host_offsets, const Tensor& dw,
                                    bool accumulate) {
  const GroupedRows part{dy, x, offsets, host_offsets};
  GroupedMatmulWeightGrad({&part, 1}, dw, accumulate);
}

// Transfers, the same on every backend (Stream::CopyAsync):
// dst = src, same shape and dtype. Either side may be another device or pinned host memory of
// the same backend; ordered on the compute stream of the device side.
void Copy(const Tensor& src, const Tensor& dst);
// Synchronous transfers between a tensor and ordinary host memory of t.nbytes() bytes. A small
// device tensor is read through ReadSmallToHost (not on a copy engine).
void CopyFromHost(const void* src, const Tensor& dst);
void CopyToHost(const Tensor& src, void* dst);

// Composite ops, the same on every backend: a backend may run them as one kernel.
// GroupedMatmul(x, w, offsets, host_offsets, h, transpose_w=true) then SwigluForward(h, scale, a):
//   w (groups, 2f, k), h (rows, 2f) = [gate | up] =, a (rows, f) =, scale (rows) f32 or undefined.
// CUDA: the Hopper fc1 kernel computes a in its epilogue from h as it stores it (bf16), with
// SwigluForward's formula: both results bit-identical to the two ops'.
void GroupedMatmulSwiglu(const Tensor& x, const Tensor& w, const Tensor& offsets,
                         std::span<const int32_t> host_offsets, const Tensor& scale,
                         const Tensor& h, const Tensor& a);
// GroupedMatmul(dy, w, offsets, host_offsets, da, transpose_w=false) then SwigluBackward(da, h,
// scale, dh, dscale), da (rows, f) never kept: dy (rows, k), w (groups, k, f) (fc2's weights),
// h (rows, 2f) = [gate | up] as saved by GroupedMatmulSwiglu, dh (rows, 2f) =, dscale (rows) f32 =
// or undefined, scale (rows) f32 or undefined. CUDA: where k is at least
// cuda::kFusedSwigluBackwardMinK (below, the two ops are faster) the Hopper kernel computes dh in
// its epilogue from da rounded to h's dtype, as the two ops would store it: dh bit-identical to
// theirs; dscale the same sum in another order.
void GroupedMatmulSwigluBackward(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                 std::span<const int32_t> host_offsets, const Tensor& h,
                                 const Tensor& scale, const Tensor& dh, const Tensor& dscale);
// The MoE router's gate: SoftmaxForward(logits, probs), TopK(probs, values, indices), then
// NormalizeRowsForward(values, weights) where `renormalize` (the top k's probabilities rescaled to
// sum 1), else weights = values (Megatron's --moe_router_pre_softmax). logits, probs (tokens,
// experts) f32; values, weights (tokens, k) f32, 1 <= k <= experts; indices (tokens, k) i32.
// CUDA: one kernel where a row fits a warp (experts <= 256, k <= 32): the same formulas, the
// softmax's sum in another order.
void RouterGateForward(const Tensor& logits, bool renormalize, const Tensor& probs,
                       const Tensor& values, const Tensor& weights, const Tensor& indices);
// Its backward with the load-balancing loss's gradient: dvalues = NormalizeRowsBackward(dweights,
// values) where `renormalize` (as the forward's), else dweights; TopKBackward(dvalues, indices,
// dprobs), LoadBalancingLossBackward(offsets, k, balance_grad, dprobs), then
// SoftmaxBackward(dprobs, probs, dlogits) computed in f32 and stored in dlogits' dtype (f32 or
// bf16) =. dweights (tokens, k) f32; values, indices and probs as RouterGateForward wrote them;
// offsets (experts + 1) i32 as SortByKey wrote them.
// CUDA: one kernel where the forward's is one (the softmax backward's sum in another order).
void RouterGateBackward(const Tensor& dweights, const Tensor& values, const Tensor& indices,
                        const Tensor& probs, const Tensor& offsets, float balance_grad,
                        bool renormalize, const Tensor& dlogits);

}  // namespace moe::ops
