// The row counts of one micro-batch's expert-parallel token exchange (host side), for the MoE
// layer under an expert group of E ranks, rank r holding experts [r * L, (r + 1) * L),
// L = num_experts / E.
//   counts (E, num_experts) i32, a CPU tensor: row s = rank s's rows per expert (its router's);
//   send_offsets (E + 1): this rank's permuted rows (sorted by expert) for rank p are
//   [send_offsets[p], send_offsets[p + 1]) (the rows of p's experts);
//   recv_offsets (E + 1): the rows received from source rank s are [recv_offsets[s],
//   recv_offsets[s + 1]) of the received batch (source order), each source's sorted by expert;
//   segment_offsets (E, L + 1) i32, a CPU tensor: row s = source s's rows per local expert as
//   offsets from 0.
// Exchange is collective over the group (the counts gathered through the host: the one host
// synchronisation of the exchange); the constructor rebuilds the route from saved counts.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/communicator.h"
#include "modules/expert_parallel.h"

namespace moe {

class ExpertRoute {
 public:
  // offsets (num_experts + 1) i32 on the group's device: this rank's router offsets.
  static ExpertRoute Exchange(Communicator& group, const Tensor& offsets);
  // counts (E, num_experts) as above; rank: this rank's place in the group.
  ExpertRoute(Tensor counts, int rank);

  const Tensor& counts() const { return counts_; }
  const std::vector<int64_t>& send_offsets() const { return send_offsets_; }
  const std::vector<int64_t>& recv_offsets() const { return recv_offsets_; }
  int sources() const { return static_cast<int>(counts_.dim(0)); }
  int64_t rows_from(int source) const { return recv_offsets_[source + 1] - recv_offsets_[source]; }
  const Tensor& segment_offsets() const { return segment_offsets_; }
  // Adds the route's rows per expert and per receiving rank to `traffic` (sized on first use), and
  // appends its rows per receiving rank to traffic.rows_per_exchange.
  void AddTo(ExpertTraffic& traffic) const;

 private:
  Tensor counts_;
  int rank_;
  int64_t local_experts_;
  std::vector<int64_t> send_offsets_;
  std::vector<int64_t> recv_offsets_;
  Tensor segment_offsets_;
};

}  // namespace moe
