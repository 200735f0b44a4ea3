// Counters every allocator reports. Byte figures count whole blocks as handed out.
#pragma once

#include <cstdint>
#include <string>

namespace moe {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // in use by tensors, or freed while another stream still
                                     // reads them (RecordStream; until its event has completed)
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last ResetPeak
  int64_t reserved_bytes = 0;        // taken from the raw source (in use + cached)
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocations = 0;      // Allocate calls
  int64_t num_cache_hits = 0;       // served from a cached block
  int64_t num_raw_allocations = 0;  // went to the raw source

  std::string ToString() const;
};

}  // namespace moe
