// World: this process's place in the job. Under mpirun: rank, size and local rank (the rank among
// the processes of this host, from MPI_Comm_split_type SHARED) come from MPI. Started without
// mpirun the process is a one-rank world (MPI singleton init), as it always is in a build without
// MPI.
//
// Init initialises MPI with MPI_THREAD_MULTIPLE, which the CPU communicators need (their worker
// threads and the host thread call MPI at once, each on its own MPI communicator); an MPI without
// it is an error Status. It sets the rank that CHECK/call-check failures name (SetProcessRank). MPI
// errors abort the process with the call, rank and host (MOE_MPI_CALL); when one rank exits
// non-zero, mpirun ends the others. Create one World per process, from main, before other threads
// use MPI; destroying it finalises MPI, so it must outlive every Communicator.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/core/stream.h"
#include "engine/distributed/communicator.h"

namespace moe {

class World {
 public:
  static StatusOr<std::unique_ptr<World>> Init();
  virtual ~World() = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // The device this rank computes on: the CPU, or CUDA device local_rank (then selected for the
  // calling thread). An error if this host has fewer CUDA devices than ranks.
  StatusOr<Device> SelectDevice(DeviceType type) const;

  // Collective over all ranks: a communicator whose operations run on `stream` (its device picks
  // the backend: MPI for the CPU, NCCL for CUDA; rank 0 makes the NCCL id and broadcasts it).
  virtual std::unique_ptr<Communicator> NewCommunicator(
      Stream& stream, std::chrono::milliseconds timeout = kDefaultCommTimeout) = 0;

  // Collective, host-blocking: every rank gets the same result. OK if every rank's `local` is OK;
  // otherwise the status of the lowest failing rank (code and message), its message followed by
  // which rank it was and how many failed, e.g. "--pipeline_parallel=3 does not divide 4 ranks
  // (rank 0; 4 of 4 ranks failed)". Lets every rank exit non-zero together with one message.
  virtual Status AllAgree(const Status& local) = 0;

  // Collective, host-blocking: root's `data` (any length) on every rank; for small host-side
  // documents compared before any communicator exists (e.g. the run's configuration).
  virtual std::string Broadcast(const std::string& data, int root) = 0;

 protected:
  World(int rank, int size, int local_rank, int local_size);

 private:
  const int rank_;
  const int size_;
  const int local_rank_;
  const int local_size_;
};

}  // namespace moe
