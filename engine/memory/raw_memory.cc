#include "engine/memory/raw_memory.h"

#include <unistd.h>

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
  size_t CapacityBytes() const override {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * page_size : 0;
  }
};

}  // namespace

std::unique_ptr<RawMemory> NewHostRawMemory() { return std::make_unique<HostRawMemory>(); }

}  // namespace moe
