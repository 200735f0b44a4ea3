// A tensor with the name it is stored under in a checkpoint (e.g. "layers.0.attn.q_proj.weight").
#pragma once

#include <string>

#include "engine/core/tensor.h"

namespace moe {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

}  // namespace moe
