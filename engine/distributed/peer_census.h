// PeerCensus: which ranks of a communicator did not arrive at an operation that timed out, for
// its watchdog's message (comm_watchdog.h: Hooks::census). The one implementation runs over MPI
// (mpi_peer_census.h) and serves the MPI and the NCCL communicators alike: the census travels on
// the host, beside whatever hung.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/distributed/comm_watchdog.h"

namespace moe {

class PeerCensus {
 public:
  virtual ~PeerCensus() = default;

  // Once per process, on the watchdog thread of the timed-out `operation`.
  virtual CommWatchdog::Census Take(const std::string& operation,
                                    std::chrono::milliseconds grace) = 0;

  // Collective over the census's ranks, as Communicator::Split: the census of the communicator
  // that the same split makes.
  virtual std::unique_ptr<PeerCensus> Split(int color, int key) = 0;
};

}  // namespace moe
