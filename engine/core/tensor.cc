#include "engine/core/tensor.h"

#include <sstream>

#include <glog/logging.h>

namespace moe {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Tensor Tensor::Wrap(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                    size_t offset_bytes) {
  for (int64_t d : shape) CHECK_GE(d, 0) << "negative dimension in " << ShapeString(shape);
  CHECK(storage != nullptr);
  CHECK_LE(offset_bytes + static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype),
           storage->bytes())
      << "view " << ShapeString(shape) << " " << DTypeName(dtype) << " at offset " << offset_bytes
      << " exceeds storage of " << storage->bytes() << " bytes";
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset_bytes;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  CHECK(i >= -n && i < n) << "dim " << i << " of " << DebugString();
  return shape_[i < 0 ? i + n : i];
}

Device Tensor::device() const {
  CHECK(defined());
  return storage_->device();
}

MemorySpace Tensor::space() const {
  CHECK(defined());
  return storage_->space();
}

void* Tensor::data() const {
  CHECK(defined()) << "data() of an undefined tensor";
  return static_cast<char*>(storage_->data()) + offset_;
}

void Tensor::CheckDType(DType expected) const {
  CHECK(dtype_ == expected) << "tensor " << DebugString() << " accessed as " << DTypeName(expected);
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  CHECK_GE(ndim(), 1);
  CHECK(0 <= begin && begin <= end && end <= shape_[0])
      << "rows [" << begin << ", " << end << ") of " << DebugString();
  Shape shape = shape_;
  shape[0] = end - begin;
  const size_t row_bytes = nbytes() / (shape_[0] ? shape_[0] : 1);
  Tensor t = Wrap(storage_, shape, dtype_, offset_ + static_cast<size_t>(begin) * row_bytes);
  t.is_parameter_ = is_parameter_;
  t.do_not_offload_ = do_not_offload_;
  return t;
}

Tensor Tensor::View(const Shape& shape) const {
  CHECK_EQ(NumElements(shape), numel()) << "view " << ShapeString(shape) << " of " << DebugString();
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void Tensor::RecordStream(Stream& stream) const {
  CHECK(defined());
  storage_->RecordStream(stream);
}

std::string Tensor::DebugString() const {
  if (!defined()) return "undefined";
  return std::string(DTypeName(dtype_)) + ShapeString(shape_) + " " + device().ToString() + " " +
         MemorySpaceName(space());
}

}  // namespace moe
