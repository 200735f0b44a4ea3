#include "engine/core/dtype.h"

#include <glog/logging.h>

namespace moe {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kE4M3:
      return 1;
  }
  LOG(FATAL) << "unknown dtype " << static_cast<int>(dtype);
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kE4M3:
      return "e4m3";
  }
  LOG(FATAL) << "unknown dtype " << static_cast<int>(dtype);
}

bool IsFloating(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

}  // namespace moe
