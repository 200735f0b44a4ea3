// MpiPeerCensus: after an operation of an MPI communicator timed out (comm_watchdog.h), which of
// its ranks did not arrive at it (include only from MPI translation units).
//
// The census runs on a duplicate of the communicator (MPI's own, or for NCCL the MPI communicator
// of the same ranks), made when the communicator is (a collective), so its messages never mix
// with the operations'. Take, on the watchdog thread of
// the timed-out operation, sends "waiting in <operation>" to every other rank of the
// communicator (non-blocking, never waited for: a peer may be stopped or dead), then for `grace`
// receives what the peers whose own operations time out meanwhile send. A rank heard from
// waits too, in the same operation or in another (then named); a rank not heard from is one that
// did not arrive: it is computing, stopped, hung outside communication, or waiting in another
// communicator's operation. A rank that arrived more than `grace` after this one is counted as
// not arrived: it was that late. Ranks are named by their world rank. The lowest world rank
// among those that wait reports (Census::report_here), so the job's failure is one line.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "engine/distributed/peer_census.h"

namespace moe {

class MpiPeerCensus final : public PeerCensus {
 public:
  // Collective over `comm`, which stays the caller's (the census works on a duplicate).
  static std::unique_ptr<MpiPeerCensus> Duplicating(MPI_Comm comm);
  ~MpiPeerCensus() override;
  MpiPeerCensus(const MpiPeerCensus&) = delete;
  MpiPeerCensus& operator=(const MpiPeerCensus&) = delete;

  CommWatchdog::Census Take(const std::string& operation, std::chrono::milliseconds grace) override;
  std::unique_ptr<PeerCensus> Split(int color, int key) override;

 private:
  explicit MpiPeerCensus(MPI_Comm owned);

  MPI_Comm comm_;
  int rank_ = 0;
  std::vector<int> world_ranks_;  // by rank of comm_
};

}  // namespace moe
