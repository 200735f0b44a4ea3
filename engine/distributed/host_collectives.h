// Host collectives over a group of ranks, for small statistics and tables (losses, norms, memory
// figures, policy summaries). The values travel through a device tensor on the group's device:
// uploaded on its compute stream, combined on the group's stream between events both ways
// (EnqueueBetween), read back. Each blocks the host. A null group, or one of one rank, combines
// nothing: the values stay as they are.
//   AllReduceHostValues: floats summed over the ranks (Communicator::AllReduceSum's order).
//   AllGatherHost: every rank's values, by rank (one Broadcast per rank): exact for any trivially
//   copyable type (integers, doubles, plain structs), no packing into floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/distributed/communicator.h"

namespace moe {

void AllReduceHostValues(Communicator* group, std::vector<float>& values);

// Rank r's `bytes` bytes at [r * bytes, (r + 1) * bytes) of the result, for every rank r.
// Every rank passes the same `bytes`.
std::vector<uint8_t> AllGatherHostBytes(Communicator* group, const void* mine, size_t bytes);

// Rank r's values at [r * n, (r + 1) * n), n = mine.size(), the same on every rank.
template <typename T>
std::vector<T> AllGatherHost(Communicator* group, const std::vector<T>& mine) {
  static_assert(std::is_trivially_copyable_v<T>);
  const std::vector<uint8_t> bytes =
      AllGatherHostBytes(group, mine.data(), mine.size() * sizeof(T));
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace moe
