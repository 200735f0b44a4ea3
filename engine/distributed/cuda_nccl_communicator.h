// The CUDA backend's Communicator: NCCL, on a CudaStream (built with CUDA only; this header needs
// no CUDA headers, so MPI code can make NCCL ids and communicators through it).
//
// Operations are enqueued on the comm stream's cudaStream_t: ncclAllReduce and ncclReduceScatter
// (f32 or bf16, sum), ncclBroadcast and ncclAllGather (as bytes), and ncclSend/ncclRecv between
// ncclGroupStart/End for a transfer group. In place, ReduceScatterSum and AllGather hand NCCL the
// pointers of its own in-place convention (communicator.h). Tensors are recorded on the comm
// stream (Tensor::RecordStream). Split is ncclCommSplit. Barrier is a one-element all-reduce and a
// stream synchronize.
//
// Failure (NCCL's own kernels spin forever when a peer is gone): each communicator has a
// CommWatchdog that polls ncclCommGetAsyncError and the CUDA event recorded after every operation.
// An operation is watched from its host call on (ncclGroupEnd blocks the host while NCCL connects
// to a new peer, so a peer that never comes hangs there) until the comm stream has passed it. On
// an asynchronous error, or an operation not finished `timeout` after its call, the watchdog calls
// ncclCommAbort and ends the process, and mpirun then ends the other ranks. With a PeerCensus (an
// MPI communicator of the same ranks beside it: mpi_world.cc), a timeout's message names the
// ranks that did not arrive, and one rank reports it; Split splits the census alike. The
// communicator is created in NCCL's default blocking mode.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "engine/distributed/communicator.h"
#include "engine/distributed/peer_census.h"

namespace moe {

inline constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

// A fresh ncclUniqueId as bytes. One rank makes it and sends it to the others.
std::string NewNcclUniqueId();

// Collective over `size` processes that pass the same id: this process is `rank`. `stream` is a
// CudaStream; its device is selected for the calling thread. `census`: of the same ranks, or
// null (one process).
std::unique_ptr<Communicator> NewNcclCommunicator(const std::string& unique_id, int rank, int size,
                                                  Stream& stream, std::chrono::milliseconds timeout,
                                                  std::unique_ptr<PeerCensus> census);

}  // namespace moe
