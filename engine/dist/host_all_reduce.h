// AllReduceHostValues: host floats summed over a group of ranks, for small statistics (losses,
// norms, memory figures, tables). The values travel through a device tensor on the group's
// device: uploaded on its compute stream, summed on the group's stream between events both ways
// (EnqueueBetween), read back. Blocks the host. A null group, or one of one rank, leaves the
// values as they are.
#pragma once

#include <vector>

#include "engine/dist/communicator.h"

namespace moe {

void AllReduceHostValues(Communicator* group, std::vector<float>& values);

}  // namespace moe
