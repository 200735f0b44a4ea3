// World::Init for builds with MPI (see world.h).
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/mpi_check.h"
#include "engine/distributed/mpi_communicator.h"
#include "engine/distributed/mpi_peer_census.h"
#include "engine/distributed/world.h"
#if MOE_WITH_CUDA
#include "engine/distributed/cuda_nccl_communicator.h"
#endif

namespace moe {
namespace {

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

class MpiWorld final : public World {
 public:
  // `host_comm` (owned) carries the host thread's own traffic: AllAgree, NCCL ids, and the
  // duplicates that become communicators.
  MpiWorld(MPI_Comm host_comm, int rank, int size, int local_rank, int local_size)
      : World(rank, size, local_rank, local_size), host_comm_(host_comm) {}

  ~MpiWorld() override {
    MOE_MPI_CALL(MPI_Comm_free(&host_comm_));
    MOE_MPI_CALL(MPI_Finalize());
  }

  std::unique_ptr<Communicator> NewCommunicator(Stream& stream,
                                                std::chrono::milliseconds timeout) override {
#if MOE_WITH_CUDA
    if (stream.device().is_cuda()) {
      std::string id(kNcclUniqueIdBytes, '\0');
      if (rank() == 0) id = NewNcclUniqueId();
      MOE_MPI_CALL(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, host_comm_));
      return NewNcclCommunicator(id, rank(), size(), stream, timeout,
                                 MpiPeerCensus::Duplicating(host_comm_));
    }
#endif
    MPI_Comm comm = MPI_COMM_NULL;
    MOE_MPI_CALL(MPI_Comm_dup(host_comm_, &comm));
    return std::make_unique<MpiCommunicator>(comm, stream, timeout);
  }

  Status AllAgree(const Status& local) override {
    const int failed = local.ok() ? 0 : 1;
    std::vector<int> failed_by_rank(size());
    MOE_MPI_CALL(MPI_Allgather(&failed, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT, host_comm_));
    int first = -1, failures = 0;
    for (int r = 0; r < size(); ++r) {
      if (!failed_by_rank[r]) continue;
      if (first < 0) first = r;
      ++failures;
    }
    if (first < 0) return Status::Ok();
    int header[2] = {static_cast<int>(local.code()), static_cast<int>(local.message().size())};
    MOE_MPI_CALL(MPI_Bcast(header, 2, MPI_INT, first, host_comm_));
    std::string message = rank() == first ? local.message() : std::string(header[1], '\0');
    MOE_MPI_CALL(MPI_Bcast(message.data(), header[1], MPI_CHAR, first, host_comm_));
    if (size() > 1) {
      message += " (rank " + std::to_string(first) + "; " + std::to_string(failures) + " of " +
                 std::to_string(size()) + " ranks failed)";
    }
    return Status(static_cast<StatusCode>(header[0]), std::move(message));
  }

  std::string Broadcast(const std::string& data, int root) override {
    uint64_t length = data.size();
    MOE_MPI_CALL(MPI_Bcast(&length, 1, MPI_UINT64_T, root, host_comm_));
    std::string out = rank() == root ? data : std::string(length, '\0');
    CHECK_LE(length, uint64_t{1} << 30) << "World::Broadcast is for small documents";
    MOE_MPI_CALL(MPI_Bcast(out.data(), static_cast<int>(length), MPI_CHAR, root, host_comm_));
    return out;
  }

 private:
  MPI_Comm host_comm_;
};

}  // namespace

StatusOr<std::unique_ptr<World>> World::Init() {
  int initialized = 0, finalized = 0;
  MOE_MPI_CALL(MPI_Initialized(&initialized));
  MOE_MPI_CALL(MPI_Finalized(&finalized));
  CHECK(!initialized && !finalized)
      << "World::Init: MPI was initialised before (one World per process)";
  int provided = MPI_THREAD_SINGLE;
  MOE_MPI_CALL(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    MOE_MPI_CALL(MPI_Finalize());
    return FailedPrecondition(std::string("this MPI library provides only ") +
                              ThreadLevelName(provided) +
                              "; the trainer's communicators need MPI_THREAD_MULTIPLE");
  }
  MPI_Comm host_comm = MPI_COMM_NULL;
  MOE_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &host_comm));
  // Errors come back to MOE_MPI_CALL, which names the call, rank and host before aborting; every
  // communicator made from host_comm inherits this.
  MOE_MPI_CALL(MPI_Comm_set_errhandler(host_comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  MOE_MPI_CALL(MPI_Comm_rank(host_comm, &rank));
  MOE_MPI_CALL(MPI_Comm_size(host_comm, &size));
  SetProcessRank(rank);

  MPI_Comm host_local = MPI_COMM_NULL;
  MOE_MPI_CALL(
      MPI_Comm_split_type(host_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host_local));
  int local_rank = 0, local_size = 0;
  MOE_MPI_CALL(MPI_Comm_rank(host_local, &local_rank));
  MOE_MPI_CALL(MPI_Comm_size(host_local, &local_size));
  MOE_MPI_CALL(MPI_Comm_free(&host_local));
  return std::unique_ptr<World>(
      std::make_unique<MpiWorld>(host_comm, rank, size, local_rank, local_size));
}

}  // namespace moe
