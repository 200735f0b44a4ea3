#include "engine/distributed/mpi_peer_census.h"

#include <map>
#include <numeric>
#include <thread>

#include "engine/core/mpi_check.h"

namespace moe {
namespace {

constexpr int kCensusTag = 0;

// "rank 1", "ranks 1, 3".
std::string RankList(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::unique_ptr<MpiPeerCensus> MpiPeerCensus::Duplicating(MPI_Comm comm) {
  MPI_Comm duplicate = MPI_COMM_NULL;
  MOE_MPI_CALL(MPI_Comm_dup(comm, &duplicate));
  return std::unique_ptr<MpiPeerCensus>(new MpiPeerCensus(duplicate));
}

MpiPeerCensus::MpiPeerCensus(MPI_Comm owned) : comm_(owned) {
  int size = 0;
  MOE_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
  MOE_MPI_CALL(MPI_Comm_size(comm_, &size));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MOE_MPI_CALL(MPI_Comm_group(comm_, &group));
  MOE_MPI_CALL(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  world_ranks_.resize(size);
  MOE_MPI_CALL(MPI_Group_translate_ranks(group, size, ranks.data(), world, world_ranks_.data()));
  MOE_MPI_CALL(MPI_Group_free(&group));
  MOE_MPI_CALL(MPI_Group_free(&world));
}

MpiPeerCensus::~MpiPeerCensus() { MOE_MPI_CALL(MPI_Comm_free(&comm_)); }

std::unique_ptr<PeerCensus> MpiPeerCensus::Split(int color, int key) {
  MPI_Comm split = MPI_COMM_NULL;
  MOE_MPI_CALL(MPI_Comm_split(comm_, color, key, &split));
  return std::unique_ptr<PeerCensus>(new MpiPeerCensus(split));
}

CommWatchdog::Census MpiPeerCensus::Take(const std::string& operation,
                                         std::chrono::milliseconds grace) {
  const int size = static_cast<int>(world_ranks_.size());
  // Sent without waiting, to peers that may never receive it: it must outlive this call.
  const auto* sent = new std::string(operation);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank_) continue;
    MPI_Request request;
    MOE_MPI_CALL(MPI_Isend(sent->data(), static_cast<int>(sent->size()), MPI_CHAR, peer, kCensusTag,
                           comm_, &request));
    MOE_MPI_CALL(MPI_Request_free(&request));
  }
  std::map<int, std::string> waiting;  // peer (rank of comm_) -> the operation it waits in
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (static_cast<int>(waiting.size()) < size - 1 &&
         std::chrono::steady_clock::now() < deadline) {
    int arrived = 0;
    MPI_Status status;
    MOE_MPI_CALL(MPI_Iprobe(MPI_ANY_SOURCE, kCensusTag, comm_, &arrived, &status));
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    int bytes = 0;
    MOE_MPI_CALL(MPI_Get_count(&status, MPI_CHAR, &bytes));
    std::string text(static_cast<size_t>(bytes), '\0');
    MOE_MPI_CALL(MPI_Recv(text.data(), bytes, MPI_CHAR, status.MPI_SOURCE, kCensusTag, comm_,
                          MPI_STATUS_IGNORE));
    waiting[status.MPI_SOURCE] = std::move(text);
  }
  std::vector<int> absent;
  std::string elsewhere;  // peers waiting in another operation
  bool lowest = true;     // no waiting peer has a lower world rank
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank_) continue;
    const auto it = waiting.find(peer);
    if (it == waiting.end()) {
      absent.push_back(world_ranks_[peer]);
      continue;
    }
    if (world_ranks_[peer] < world_ranks_[rank_]) lowest = false;
    if (it->second != operation) {
      elsewhere += ", rank " + std::to_string(world_ranks_[peer]) + " in " + it->second;
    }
  }
  std::string finding;
  if (!absent.empty()) {
    finding = RankList(absent) + " did not arrive";
  } else {
    finding = "every rank waits (a deadlock: the ranks issued different operations)";
  }
  if (!elsewhere.empty()) finding += "; waiting elsewhere: " + elsewhere.substr(2);
  return {finding, lowest};
}

}  // namespace moe
