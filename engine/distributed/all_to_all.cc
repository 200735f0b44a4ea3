#include "engine/distributed/all_to_all.h"

#include <glog/logging.h>

namespace moe {

std::vector<int64_t> BlockOffsets(std::span<const int64_t> counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

int64_t AllToAllRows(Communicator& comm, Stream& compute, std::span<const RowExchange> tensors,
                     std::span<const int64_t> send_offsets, std::span<const int64_t> recv_offsets) {
  const size_t peers = static_cast<size_t>(comm.size());
  CHECK_EQ(send_offsets.size(), peers + 1) << "send offsets for " << peers << " ranks";
  CHECK_EQ(recv_offsets.size(), peers + 1) << "receive offsets for " << peers << " ranks";
  for (const RowExchange& t : tensors) {
    CHECK_EQ(t.send.dim(0), send_offsets.back()) << "rows to send";
    CHECK_EQ(t.recv.dim(0), recv_offsets.back()) << "rows to receive";
    CHECK(t.send.dtype() == t.recv.dtype() &&
          t.send.numel() * t.recv.dim(0) == t.recv.numel() * t.send.dim(0))
        << "AllToAllRows of " << t.send.DebugString() << " into " << t.recv.DebugString();
  }
  int64_t bytes = 0;
  EnqueueBetween(comm, compute, [&] {
    comm.GroupStart();
    for (size_t peer = 0; peer < peers; ++peer) {
      const int p = static_cast<int>(peer);
      for (const RowExchange& t : tensors) {
        if (recv_offsets[peer] != recv_offsets[peer + 1]) {
          comm.Recv(t.recv.Rows(recv_offsets[peer], recv_offsets[peer + 1]), p);
        }
        if (send_offsets[peer] != send_offsets[peer + 1]) {
          const Tensor block = t.send.Rows(send_offsets[peer], send_offsets[peer + 1]);
          comm.Send(block, p);
          if (p != comm.rank()) bytes += static_cast<int64_t>(block.nbytes());
        }
      }
    }
    comm.GroupEnd();
  });
  return bytes;
}

}  // namespace moe
