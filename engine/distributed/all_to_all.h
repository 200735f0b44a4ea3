// All-to-all of row blocks with sizes that vary by peer (expert-parallel token dispatch): rank p
// sends rows [send_offsets[q], send_offsets[q + 1]) of each send tensor to rank q and receives
// rank q's rows into rows [recv_offsets[q], recv_offsets[q + 1]) of the matching recv tensor. The
// offsets (size + 1 each, host) must agree across ranks: what p sends to q is what q expects from
// p (exchange the counts first, e.g. with AllGatherHost). Several tensors with the same row split
// (say the rows and their routing weights) travel in one group of transfers.
//
// One group of Send/Recv on comm's stream (NCCL grouped send/recv on CUDA, MPI point-to-point on
// the CPU), ordered after the work already enqueued on `compute`, and later compute work waits
// for it (EnqueueBetween). Empty blocks move nothing; a rank's block to itself goes through the
// communicator too (a self transfer inside the group). No host synchronisation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/distributed/communicator.h"

namespace moe {

struct RowExchange {
  Tensor send;  // (rows sent, ...) contiguous rows
  Tensor recv;  // (rows received, ...) the same row width and dtype
};

// Returns the bytes this rank sends to other ranks (its own block excluded).
int64_t AllToAllRows(Communicator& comm, Stream& compute, std::span<const RowExchange> tensors,
                     std::span<const int64_t> send_offsets, std::span<const int64_t> recv_offsets);

// Offsets (n + 1) of consecutive blocks of the given row counts: 0, c0, c0 + c1, ...
std::vector<int64_t> BlockOffsets(std::span<const int64_t> counts);

}  // namespace moe
