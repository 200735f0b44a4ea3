#include "engine/memory/raw_memory.h"

#include <cstdlib>

namespace moe {
namespace {

class HostRawMemory final : public RawMemory {
 public:
  void* Allocate(size_t bytes) override {
    constexpr size_t kAlign = 256;
    return std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  }
  void Free(void* ptr) override { std::free(ptr); }
};

}  // namespace

std::unique_ptr<RawMemory> NewHostRawMemory() { return std::make_unique<HostRawMemory>(); }

}  // namespace moe
