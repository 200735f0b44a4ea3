// Tensor: a shaped, typed view of shared Storage. Contiguous, row-major; views share storage
// (Rows() slices the leading dimension, View() reshapes). Copying a Tensor copies the handle.
//
// Flags travel with the handle: is_parameter (a model weight: never offloaded) and
// do_not_offload (the owner asks the offload manager to leave it on the device).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/bfloat16.h"
#include "engine/core/device.h"
#include "engine/core/dtype.h"
#include "engine/core/float8.h"
#include "engine/core/storage.h"

namespace moe {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<BFloat16>() {
  return DType::kBF16;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kU8;
}
template <>
constexpr DType DTypeOf<Float8E4M3>() {
  return DType::kE4M3;
}

class Tensor {
 public:
  Tensor() = default;  // undefined

  // New memory from the device's caching allocator (ordered on its compute stream) or from the
  // pinned host pool. Contents are uninitialised. (Defined by the runtime, which owns the
  // allocators: engine/runtime/tensor_allocation.cc.)
  static Tensor Empty(const Shape& shape, DType dtype, Device device,
                      MemorySpace space = MemorySpace::kDevice);
  // Device memory whose use is ordered on `stream` (e.g. a reload buffer on a copy stream).
  static Tensor EmptyOnStream(const Shape& shape, DType dtype, Stream& stream);
  // A view of existing storage starting `offset_bytes` in.
  static Tensor Wrap(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                     size_t offset_bytes = 0);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const;
  MemorySpace space() const;

  void* data() const;
  template <typename T>
  T* data() const {
    CheckDType(DTypeOf<T>());
    return static_cast<T*>(data());
  }
  // The elements, for memory the host can read (a CPU tensor, pinned host memory).
  template <typename T>
  std::span<T> values() const {
    return {data<T>(), static_cast<size_t>(numel())};
  }

  // Rows [begin, end) of the leading dimension, sharing storage.
  Tensor Rows(int64_t begin, int64_t end) const;
  // The same elements under another shape.
  Tensor View(const Shape& shape) const;

  bool is_parameter() const { return is_parameter_; }
  void set_is_parameter(bool value) { is_parameter_ = value; }
  bool do_not_offload() const { return do_not_offload_; }
  void set_do_not_offload(bool value) { do_not_offload_ = value; }

  // The storage is also used on `stream`: it is not reused before that stream's work so far.
  void RecordStream(Stream& stream) const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool SharesStorageWith(const Tensor& other) const { return storage_ == other.storage_; }

  std::string DebugString() const;  // e.g. "bf16[4096, 2048] cuda:0 device"

 private:
  void CheckDType(DType expected) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  bool is_parameter_ = false;
  bool do_not_offload_ = false;
};

}  // namespace moe
