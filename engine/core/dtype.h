// Runtime element types of a Tensor and their sizes. kE4M3 is FP8 storage (engine/core/float8.h)
// for quantised operands, which always travel with their scales: not a floating dtype for the
// arithmetic ops (IsFloating is false), which take f32 or bf16.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe {

enum class DType : uint8_t { kF32, kBF16, kI32, kI64, kU8, kE4M3 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
bool IsFloating(DType dtype);

}  // namespace moe
