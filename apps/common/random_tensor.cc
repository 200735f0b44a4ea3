#include "apps/common/random_tensor.h"

#include <algorithm>
#include <random>
#include <vector>

#include "engine/kernels/ops.h"

namespace moe {

Tensor RandomTensor(const Shape& shape, DType dtype, Device device, float scale, uint32_t seed,
                    int64_t distinct) {
  const int64_t numel = NumElements(shape);
  const int64_t block = std::min(numel, distinct);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(block);
  for (float& v : values) v = normal(rng);
  const Tensor source = Tensor::Empty({block}, DType::kF32, device);
  ops::CopyFromHost(values.data(), source);
  Tensor t = Tensor::Empty(shape, dtype, device);
  const Tensor flat = t.View({numel});
  for (int64_t begin = 0; begin < numel; begin += block) {
    const int64_t end = std::min(numel, begin + block);
    ops::Cast(source.Rows(0, end - begin), flat.Rows(begin, end));
  }
  return t;
}

}  // namespace moe
