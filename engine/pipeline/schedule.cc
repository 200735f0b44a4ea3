#include "engine/pipeline/schedule.h"

#include <glog/logging.h>

#include <algorithm>
#include <deque>
#include <utility>

namespace moe {
namespace {

using Kind = Action::Kind;

// Appends one rank's actions. Receives take the next (microbatch, chunk) that needs the tensor
// from its queue: the rank's forwards that have a previous stage, and its backwards that have a
// next stage, each in compute order. Because every rank computes the same (microbatch, chunk)
// sequence, that is also the order in which the peer sends them.
class RankBuilder {
 public:
  RankBuilder(int pipeline_size, int virtual_chunks, int rank,
              const std::vector<MicrobatchChunk>& forward_order,
              const std::vector<MicrobatchChunk>& backward_order)
      : p_(pipeline_size), v_(virtual_chunks), rank_(rank) {
    for (const MicrobatchChunk& f : forward_order) {
      if (!IsFirstStage(f.chunk)) pending_activations_.push_back(f);
    }
    for (const MicrobatchChunk& b : backward_order) {
      if (!IsLastStage(b.chunk)) pending_grads_.push_back(b);
    }
  }

  void Forward(MicrobatchChunk mc) { Add(Kind::kForward, mc, -1); }
  void Backward(MicrobatchChunk mc) { Add(Kind::kBackward, mc, -1); }
  // No-ops on the last / first stage, which have nobody to send to.
  void SendActivation(MicrobatchChunk mc) {
    if (!IsLastStage(mc.chunk)) Add(Kind::kSendActivation, mc, (rank_ + 1) % p_);
  }
  void SendGrad(MicrobatchChunk mc) {
    if (!IsFirstStage(mc.chunk)) Add(Kind::kSendGrad, mc, (rank_ + p_ - 1) % p_);
  }
  void RecvActivation() {
    CHECK(!pending_activations_.empty()) << "rank " << rank_ << " receives one activation too many";
    Add(Kind::kRecvActivation, pending_activations_.front(), (rank_ + p_ - 1) % p_);
    pending_activations_.pop_front();
  }
  void RecvGrad() {
    CHECK(!pending_grads_.empty()) << "rank " << rank_ << " receives one gradient too many";
    Add(Kind::kRecvGrad, pending_grads_.front(), (rank_ + 1) % p_);
    pending_grads_.pop_front();
  }

  bool IsFirstStage(int chunk) const { return rank_ == 0 && chunk == 0; }

  RankActions Finish() && {
    CHECK(pending_activations_.empty() && pending_grads_.empty())
        << "rank " << rank_ << " misses receives";
    return std::move(actions_);
  }

 private:
  bool IsLastStage(int chunk) const { return rank_ == p_ - 1 && chunk == v_ - 1; }
  void Add(Kind kind, MicrobatchChunk mc, int peer) {
    actions_.push_back({kind, mc.microbatch, mc.chunk, peer});
  }

  int p_, v_, rank_;
  std::deque<MicrobatchChunk> pending_activations_, pending_grads_;
  RankActions actions_;
};

// Megatron's forward_backward_pipelining_without_interleaving (and, for p = 1, the
// no-pipelining order F0 B0 F1 B1 ...).
RankActions Build1F1B(int p, int m, int rank) {
  std::vector<MicrobatchChunk> order;
  for (int i = 0; i < m; ++i) order.push_back({i, 0});
  RankBuilder b(p, 1, rank, order, order);
  const int warmup = std::min(p - rank - 1, m);
  const int steady = m - warmup;
  const bool has_prev = rank > 0, has_next = rank < p - 1;
  for (int i = 0; i < warmup; ++i) {
    if (has_prev) b.RecvActivation();
    b.Forward(order[i]);
    b.SendActivation(order[i]);
  }
  if (steady > 0 && has_prev) b.RecvActivation();
  for (int i = 0; i < steady; ++i) {
    b.Forward(order[warmup + i]);
    b.SendActivation(order[warmup + i]);
    if (has_next) b.RecvGrad();
    b.Backward(order[i]);
    b.SendGrad(order[i]);
    if (i + 1 < steady && has_prev) b.RecvActivation();
  }
  for (int i = steady; i < m; ++i) {
    if (has_next) b.RecvGrad();
    b.Backward(order[i]);
    b.SendGrad(order[i]);
  }
  return std::move(b).Finish();
}

// Megatron's forward_backward_pipelining_with_interleaving (microbatch groups of p, no p2p
// overlap): warmup forwards each followed by send-forward/recv-forward, steady (forward,
// backward) pairs each followed by one four-way exchange, cooldown backwards each followed by
// send-backward/recv-backward.
RankActions BuildInterleaved(int p, int v, int m, int rank) {
  const int total = m * v;
  auto forward_step = [&](int k) {
    return MicrobatchChunk{(k / (p * v)) * p + k % p, (k % (p * v)) / p};
  };
  auto backward_step = [&](int k) {
    MicrobatchChunk mc = forward_step(k);
    mc.chunk = v - 1 - mc.chunk;
    return mc;
  };
  std::vector<MicrobatchChunk> forward_order, backward_order;
  for (int k = 0; k < total; ++k) {
    forward_order.push_back(forward_step(k));
    backward_order.push_back(backward_step(k));
  }
  // Megatron's recv_tensor_from_previous_stage: whether this rank receives after virtual step k.
  // The leading rank of a direction (rank 0 forward, rank p - 1 backward) is p - 1 steps ahead
  // of the rank that feeds it, and receives what that rank produced at step k - (p - 1), unless
  // it came from the chunk that sends nothing onward (the last chunk forward, the first
  // backward). Every other rank receives after every step.
  auto receives = [&](int k, bool forward) {
    if (rank != (forward ? 0 : p - 1)) return true;
    const int aligned = k - (p - 1);
    if (aligned < 0) return false;
    return forward ? forward_step(aligned).chunk != v - 1 : backward_step(aligned).chunk != 0;
  };

  RankBuilder b(p, v, rank, forward_order, backward_order);
  const int warmup = std::min(2 * (p - rank - 1) + (v - 1) * p, total);
  const int steady = total - warmup;
  if (rank > 0) b.RecvActivation();
  for (int k = 0; k < warmup; ++k) {
    b.Forward(forward_order[k]);
    b.SendActivation(forward_order[k]);
    if (k + 1 < total && receives(k, true)) b.RecvActivation();
    if (k == warmup - 1 && steady > 0 && rank < p - 1) b.RecvGrad();
  }
  for (int k = 0; k < steady; ++k) {
    const int forward_k = warmup + k;
    b.Forward(forward_order[forward_k]);
    b.Backward(backward_order[k]);
    b.SendActivation(forward_order[forward_k]);
    b.SendGrad(backward_order[k]);
    if (k + 1 < steady && receives(forward_k, true)) b.RecvActivation();
    if (receives(k, false)) b.RecvGrad();
  }
  if (steady == 0 && rank < p - 1) b.RecvGrad();
  for (int k = steady; k < total; ++k) {
    b.Backward(backward_order[k]);
    b.SendGrad(backward_order[k]);
    if (k + 1 < total && receives(k, false)) b.RecvGrad();
  }
  return std::move(b).Finish();
}

Status Validate(const ScheduleSpec& s) {
  const std::string layout = "--pipeline_parallel=" + std::to_string(s.pipeline_size) +
                             " --virtual_pipeline=" + std::to_string(s.virtual_chunks);
  if (s.pipeline_size < 1) return InvalidArgument(layout + ": --pipeline_parallel must be >= 1");
  if (s.virtual_chunks < 1) return InvalidArgument(layout + ": --virtual_pipeline must be >= 1");
  if (s.microbatches < 1) {
    return InvalidArgument(
        "a step needs at least one microbatch (--global_batch_size / --micro_batch_size per "
        "data-parallel replica); got " +
        std::to_string(s.microbatches));
  }
  switch (s.kind) {
    case ScheduleKind::kNoPipelining:
      if (s.pipeline_size != 1 || s.virtual_chunks != 1) {
        return InvalidArgument(layout + ": the no-pipelining schedule needs one stage");
      }
      return Status::Ok();
    case ScheduleKind::k1F1B:
      if (s.virtual_chunks != 1) {
        return InvalidArgument(layout +
                               ": 1F1B runs one model chunk per rank; --virtual_pipeline above 1 "
                               "needs the interleaved schedule");
      }
      return Status::Ok();
    case ScheduleKind::kInterleaved1F1B:
      if (s.pipeline_size < 2 || s.virtual_chunks < 2) {
        return InvalidArgument(layout +
                               ": the interleaved schedule needs --pipeline_parallel >= 2 and "
                               "--virtual_pipeline >= 2");
      }
      if (s.microbatches % s.pipeline_size != 0) {
        return InvalidArgument(
            "the interleaved schedule needs the microbatches per step (--global_batch_size / "
            "--micro_batch_size per data-parallel replica, here " +
            std::to_string(s.microbatches) +
            ") to be a multiple of --pipeline_parallel=" + std::to_string(s.pipeline_size));
      }
      return Status::Ok();
  }
  return InvalidArgument("unknown schedule kind");
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kForward:
      return "F";
    case Kind::kBackward:
      return "B";
    case Kind::kSendActivation:
      return "SendAct";
    case Kind::kRecvActivation:
      return "RecvAct";
    case Kind::kSendGrad:
      return "SendGrad";
    case Kind::kRecvGrad:
      return "RecvGrad";
  }
  return "?";
}

}  // namespace

std::string Action::ToString() const {
  std::string out = std::string(KindName(kind)) + "(m" + std::to_string(microbatch) + ",c" +
                    std::to_string(chunk) + ")";
  if (is_communication()) out += (is_send() ? "->r" : "<-r") + std::to_string(peer_rank);
  return out;
}

const char* ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kNoPipelining:
      return "none";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved_1f1b";
  }
  return "?";
}

ScheduleKind DefaultScheduleKind(int pipeline_size, int virtual_chunks) {
  if (virtual_chunks > 1) return ScheduleKind::kInterleaved1F1B;
  return pipeline_size > 1 ? ScheduleKind::k1F1B : ScheduleKind::kNoPipelining;
}

StatusOr<std::vector<RankActions>> BuildSchedule(const ScheduleSpec& spec) {
  MOE_RETURN_IF_ERROR(Validate(spec));
  std::vector<RankActions> schedule;
  for (int rank = 0; rank < spec.pipeline_size; ++rank) {
    schedule.push_back(
        spec.kind == ScheduleKind::kInterleaved1F1B
            ? BuildInterleaved(spec.pipeline_size, spec.virtual_chunks, spec.microbatches, rank)
            : Build1F1B(spec.pipeline_size, spec.microbatches, rank));
  }
  return schedule;
}

std::vector<RankActions> BuildForwardOnlySchedule(int pipeline_size, int virtual_chunks,
                                                  int microbatches) {
  CHECK(pipeline_size > 0 && virtual_chunks > 0 && microbatches > 0);
  std::vector<MicrobatchChunk> order;
  for (int m = 0; m < microbatches; ++m) {
    for (int c = 0; c < virtual_chunks; ++c) order.push_back({m, c});
  }
  std::vector<RankActions> schedule;
  for (int rank = 0; rank < pipeline_size; ++rank) {
    RankBuilder b(pipeline_size, virtual_chunks, rank, order, {});
    for (const MicrobatchChunk& mc : order) {
      if (!b.IsFirstStage(mc.chunk)) b.RecvActivation();
      b.Forward(mc);
      b.SendActivation(mc);
    }
    schedule.push_back(std::move(b).Finish());
  }
  return schedule;
}

std::vector<MicrobatchChunk> BackwardOrder(const RankActions& actions) {
  std::vector<MicrobatchChunk> order;
  for (const Action& a : actions) {
    if (a.kind == Kind::kBackward) order.push_back({a.microbatch, a.chunk});
  }
  return order;
}

int MaxInFlight(const RankActions& actions) {
  int in_flight = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == Kind::kForward) peak = std::max(peak, ++in_flight);
    if (a.kind == Kind::kBackward) --in_flight;
  }
  return peak;
}

std::string RankActionsToString(const RankActions& actions) {
  std::string out;
  for (size_t i = 0; i < actions.size(); ++i) {
    const bool comm = actions[i].is_communication();
    const bool opens = comm && (i == 0 || !actions[i - 1].is_communication());
    const bool closes = comm && (i + 1 == actions.size() || !actions[i + 1].is_communication());
    if (i > 0) out += " ";
    if (opens) out += "{";
    out += actions[i].ToString();
    if (closes) out += "}";
  }
  return out;
}

std::string ScheduleToString(const std::vector<RankActions>& schedule) {
  std::string out;
  for (size_t r = 0; r < schedule.size(); ++r) {
    out += "rank " + std::to_string(r) + ": " + RankActionsToString(schedule[r]) + "\n";
  }
  return out;
}

}  // namespace moe
