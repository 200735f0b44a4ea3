// The engine's side of the Hopper grouped GEMMs (contract: grouped_matmul_sm90.h): tensors to
// the launchers of grouped_gemm_sm90.cuh. When the build has architecture 90,
// engine/CMakeLists.txt compiles this file for sm_90a alone and defines MOE_SM90A_BUILD;
// otherwise it is compiled like the rest of the engine, its kernels are traps and take no call.
#include "engine/kernels/cuda/grouped_gemm/grouped_matmul_sm90.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/common/per_device.h"
#include "engine/kernels/cuda/common/sm90_device.h"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_sm90.cuh"

namespace moe::cuda {
namespace {

// A launcher's status: launched, or declined (cudaErrorInvalidValue: shape or alignment, nothing
// done). Any other error is fatal.
bool Launched(cudaError_t status) {
  if (status == cudaErrorInvalidValue) return false;
  MOE_CUDA_CALL(status);
  return true;
}

std::atomic<bool> fuse_swiglu_backward_at_any_k{false};

// GroupedMatmulSm90's workspace for its split tail tiles on `device`: allocated on first use
// and kept for the life of the process, like the cuBLAS handle's workspace (outside the caching
// allocator, so a peak it reports does not move with it). Every launch that uses it runs on the
// device's compute stream, one after another.
sm90::SplitWorkspace SplitWorkspaceOf(Device device) {
  DeviceContext::Get(device);  // makes the device current
  return OncePerDevice<sm90::SplitWorkspace>(device.index, [&](sm90::SplitWorkspace& workspace) {
    MOE_CUDA_CALL(sm90::AllocateSplitWorkspace(device.index, &workspace));
  });
}

}  // namespace

bool Sm90GroupedGemmTakes(Device device, DType dtype, const Shape& weight_shape) {
  return device.is_cuda() && dtype == DType::kBF16 && weight_shape[0] >= 1 &&
         weight_shape[0] <= sm90::kMaxGroups && weight_shape[1] % 8 == 0 &&
         weight_shape[2] % 8 == 0 && Sm90aKernelsRunOn(device.index);
}

bool TryGroupedMatmulSm90(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y,
                          bool transpose_w) {
  if (!Sm90GroupedGemmTakes(x.device(), x.dtype(), w.shape())) return false;
  return Launched(sm90::GroupedMatmulSm90(
      Ptr<bf16>(x), Ptr<bf16>(w), Ptr<int32_t>(offsets), static_cast<int>(w.dim(0)), x.dim(0),
      y.dim(1), x.dim(1), transpose_w, Ptr<bf16>(y), SplitWorkspaceOf(y.device()), StreamOf(y)));
}

bool TryGroupedMatmulSwigluSm90(const Tensor& x, const Tensor& w, const Tensor& offsets,
                                const Tensor& scale, const Tensor& h, const Tensor& a) {
  if (!Sm90GroupedGemmTakes(x.device(), x.dtype(), w.shape())) return false;
  return Launched(sm90::GroupedMatmulSwigluSm90(
      Ptr<bf16>(x), Ptr<bf16>(w), Ptr<int32_t>(offsets), static_cast<int>(w.dim(0)), x.dim(0),
      a.dim(1), x.dim(1), Ptr<float>(scale), Ptr<bf16>(h), Ptr<bf16>(a), StreamOf(h)));
}

bool TryGroupedMatmulSwigluBackwardSm90(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                        const Tensor& h, const Tensor& scale, const Tensor& dh,
                                        const Tensor& dscale) {
  if (!Sm90GroupedGemmTakes(dy.device(), dy.dtype(), w.shape())) return false;
  if (dy.dim(1) < kFusedSwigluBackwardMinK && !fuse_swiglu_backward_at_any_k.load()) return false;
  const int64_t rows = dy.dim(0), f = w.dim(2);
  const Tensor partials =
      dscale.defined()
          ? Tensor::Empty({sm90::SwigluBackwardPartialTiles(f), rows}, DType::kF32, dy.device())
          : Tensor();
  return Launched(sm90::GroupedMatmulSwigluBackwardSm90(
      Ptr<bf16>(dy), Ptr<bf16>(w), Ptr<int32_t>(offsets), static_cast<int>(w.dim(0)), rows, f,
      dy.dim(1), Ptr<float>(scale), Ptr<bf16>(h), Ptr<bf16>(dh), Ptr<float>(partials),
      Ptr<float>(dscale), StreamOf(dh)));
}

void FuseSwigluBackwardAtAnyK(bool any_k) { fuse_swiglu_backward_at_any_k.store(any_k); }

bool TryGroupedMatmulWeightGradSm90(std::span<const ops::GroupedRows> parts, const Tensor& dw,
                                    bool accumulate) {
  // The parts share one dtype (ops::GroupedMatmulWeightGrad checks it).
  if ((dw.dtype() != DType::kF32 && dw.dtype() != DType::kBF16) ||
      !Sm90GroupedGemmTakes(dw.device(), parts.front().x.dtype(), dw.shape())) {
    return false;
  }
  std::vector<sm90::WeightGradRows> rows;
  for (const ops::GroupedRows& part : parts) {
    if (!sm90::detail::FitsInt(part.x.dim(0)) || !Aligned16(part.dy.data()) ||
        !Aligned16(part.x.data())) {
      return false;
    }
    rows.push_back(
        {Ptr<bf16>(part.dy), Ptr<bf16>(part.x), Ptr<int32_t>(part.offsets), part.x.dim(0)});
  }
  // Every launch gets the same shapes and checked parts: the first takes the call or declines
  // having done nothing, and the rest do as it did.
  const cudaStream_t stream = StreamOf(dw);
  const int groups = static_cast<int>(dw.dim(0));
  for (size_t first = 0; first < rows.size(); first += sm90::kMaxWeightGradParts) {
    const int count =
        static_cast<int>(std::min<size_t>(sm90::kMaxWeightGradParts, rows.size() - first));
    const bool add = accumulate || first > 0;
    const sm90::WeightGradRows* launch_parts = rows.data() + first;
    const bool launched =
        Launched(dw.dtype() == DType::kF32
                     ? sm90::GroupedMatmulWeightGradSm90(launch_parts, count, groups, dw.dim(1),
                                                         dw.dim(2), add, Ptr<float>(dw), stream)
                     : sm90::GroupedMatmulWeightGradSm90(launch_parts, count, groups, dw.dim(1),
                                                         dw.dim(2), add, Ptr<bf16>(dw), stream));
    if (!launched) {
      CHECK_EQ(first, 0u) << "the Hopper weight gradient declined a later launch of one call";
      return false;
    }
  }
  return true;
}

}  // namespace moe::cuda
