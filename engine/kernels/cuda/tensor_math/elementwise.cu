// CUDA Fill, Cast, Add, Scale, Axpy (contracts: engine/kernels/op_declarations.inc), all through
// Map (elementwise.cuh): fp32 arithmetic on f32 or bf16 storage. Fill also takes integer
// tensors (the value truncated toward zero) and e4m3 ones; Cast between equal dtypes is a device
// copy.
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/tensor_math/elementwise.cuh"

namespace moe::cuda {
namespace {

struct ConstantOp {
  float value;
  __device__ float operator()() const { return value; }
};

struct IdentityOp {
  __device__ float operator()(float x) const { return x; }
};

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct ScaleOp {
  float alpha;
  __device__ float operator()(float x) const { return alpha * x; }
};

struct AxpyOp {
  float alpha;
  __device__ float operator()(float x, float y) const { return y + alpha * x; }
};

template <typename T>
void FillAs(const Tensor& t, float value) {
  Map(StreamOf(t), t.numel(), ConstantOp{value}, Ptr<T>(t));
}

}  // namespace

void Fill(const Tensor& t, float value) {
  switch (t.dtype()) {
    case DType::kF32:
      return FillAs<float>(t, value);
    case DType::kBF16:
      return FillAs<bf16>(t, value);
    case DType::kI32:
      return FillAs<int32_t>(t, value);
    case DType::kI64:
      return FillAs<int64_t>(t, value);
    case DType::kU8:
      return FillAs<uint8_t>(t, value);
    case DType::kE4M3:  // the bits, rounded on the host, stored as bytes
      return FillAs<uint8_t>(t, FloatToE4M3(value).bits);
  }
  LOG(FATAL) << "fill: unknown dtype of " << t.DebugString();
}

void Cast(const Tensor& src, const Tensor& dst) {
  const cudaStream_t stream = StreamOf(src);
  if (src.dtype() == dst.dtype()) {
    if (src.data() != dst.data()) {
      MOE_CUDA_CALL(
          cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }
  DispatchFloat(src.dtype(), [&]<typename S>(TypeTag<S>) {
    DispatchFloat(dst.dtype(), [&]<typename D>(TypeTag<D>) {
      Map(stream, src.numel(), IdentityOp{}, Ptr<D>(dst), Ptr<const S>(src));
    });
  });
}

void Add(const Tensor& a, const Tensor& b, const Tensor& out) {
  DispatchFloat(a.dtype(), [&]<typename T>(TypeTag<T>) {
    Map(StreamOf(a), a.numel(), AddOp{}, Ptr<T>(out), Ptr<const T>(a), Ptr<const T>(b));
  });
}

void Scale(const Tensor& x, float alpha, const Tensor& out) {
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    Map(StreamOf(x), x.numel(), ScaleOp{alpha}, Ptr<T>(out), Ptr<const T>(x));
  });
}

void Axpy(float alpha, const Tensor& x, const Tensor& y) {
  DispatchFloat(x.dtype(), [&]<typename X>(TypeTag<X>) {
    DispatchFloat(y.dtype(), [&]<typename Y>(TypeTag<Y>) {
      Map(StreamOf(y), y.numel(), AxpyOp{alpha}, Ptr<Y>(y), Ptr<const X>(x), Ptr<const Y>(y));
    });
  });
}

}  // namespace moe::cuda
