#include "engine/core/status.h"

namespace moe {

std::string Status::ToString() const {
  switch (code_) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "invalid argument: " + message_;
    case StatusCode::kNotFound:
      return "not found: " + message_;
    case StatusCode::kDataLoss:
      return "data loss: " + message_;
    case StatusCode::kFailedPrecondition:
      return "failed precondition: " + message_;
    case StatusCode::kInternal:
      return "internal: " + message_;
  }
  return message_;
}

}  // namespace moe
