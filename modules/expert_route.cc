#include "modules/expert_route.h"

#include <glog/logging.h>

#include "engine/distributed/host_collectives.h"
#include "engine/kernels/ops.h"

namespace moe {

ExpertRoute ExpertRoute::Exchange(Communicator& group, const Tensor& offsets) {
  const int64_t experts = offsets.numel() - 1;
  std::vector<int32_t> own(static_cast<size_t>(experts + 1));
  ops::CopyToHost(offsets, own.data());
  for (int64_t e = 0; e < experts; ++e) own[e] = own[e + 1] - own[e];
  own.pop_back();
  const std::vector<int32_t> all = AllGatherHost(&group, own);
  Tensor counts = Tensor::Empty({group.size(), experts}, DType::kI32, Device::CPU());
  std::copy(all.begin(), all.end(), counts.data<int32_t>());
  return ExpertRoute(std::move(counts), group.rank());
}

ExpertRoute::ExpertRoute(Tensor counts, int rank) : counts_(std::move(counts)), rank_(rank) {
  const int ranks = static_cast<int>(counts_.dim(0));
  const int64_t experts = counts_.dim(1);
  CHECK(experts % ranks == 0) << experts << " experts over " << ranks << " ranks";
  local_experts_ = experts / ranks;
  const int32_t* c = counts_.data<int32_t>();
  send_offsets_.assign(ranks + 1, 0);
  recv_offsets_.assign(ranks + 1, 0);
  for (int p = 0; p < ranks; ++p) {
    int64_t sent = 0, received = 0;
    for (int64_t e = 0; e < local_experts_; ++e) {
      sent += c[rank_ * experts + p * local_experts_ + e];
      received += c[p * experts + rank_ * local_experts_ + e];
    }
    send_offsets_[p + 1] = send_offsets_[p] + sent;
    recv_offsets_[p + 1] = recv_offsets_[p] + received;
  }
  segment_offsets_ = Tensor::Empty({ranks, local_experts_ + 1}, DType::kI32, Device::CPU());
  int32_t* offsets = segment_offsets_.data<int32_t>();
  for (int s = 0; s < ranks; ++s, offsets += local_experts_ + 1) {
    const int32_t* rows = c + s * experts + rank_ * local_experts_;
    offsets[0] = 0;
    for (int64_t e = 0; e < local_experts_; ++e) offsets[e + 1] = offsets[e] + rows[e];
  }
}

void ExpertRoute::AddTo(ExpertTraffic& traffic) const {
  const int ranks = sources();
  const int64_t experts = counts_.dim(1);
  traffic.rows_per_expert.resize(experts, 0);
  traffic.rows_per_rank.resize(ranks, 0);
  const size_t exchange = traffic.rows_per_exchange.size();
  traffic.rows_per_exchange.resize(exchange + ranks, 0);
  const int32_t* c = counts_.data<int32_t>();
  for (int s = 0; s < ranks; ++s) {
    for (int64_t e = 0; e < experts; ++e) {
      traffic.rows_per_expert[e] += c[s * experts + e];
      traffic.rows_per_rank[e / local_experts_] += c[s * experts + e];
      traffic.rows_per_exchange[exchange + e / local_experts_] += c[s * experts + e];
    }
  }
}

}  // namespace moe
