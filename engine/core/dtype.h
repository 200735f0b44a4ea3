// Runtime element types of a Tensor and their sizes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe {

enum class DType : uint8_t { kF32, kBF16, kI32, kI64, kU8 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
bool IsFloating(DType dtype);

}  // namespace moe
