// Pipeline schedules as data: for one optimizer step, the ordered list of actions each pipeline
// rank runs, so a schedule can be printed, tested, executed by the pipeline runtime and read by
// the offload manager (BackwardOrder).
//
// Actions. (m, c) is microbatch m and model chunk c of the rank that runs the action; chunk c of
// rank r is stage StageIndex(r, c, p) = c * p + r (partition.h, Megatron's layout).
//   Forward(m, c), Backward(m, c)   compute.
//   SendActivation(m, c) -> peer     the output of Forward(m, c), to the next stage's rank.
//   RecvActivation(m, c) <- peer     the input of Forward(m, c), from the previous stage's rank.
//   SendGrad(m, c) -> peer           the input gradient of Backward(m, c), to the previous stage.
//   RecvGrad(m, c) <- peer           the output gradient Backward(m, c) needs, from the next stage.
// The first stage (embedding) has no RecvActivation / SendGrad; the last stage (loss) has no
// SendActivation / RecvGrad. The next stage of (r, c) is (r + 1, c), or (0, c + 1) from the last
// rank; the previous stage is (r - 1, c), or (p - 1, c - 1) from rank 0.
//
// Kinds (p pipeline ranks, v chunks per rank, m microbatches):
// - kNoPipelining (p = v = 1): F(0) B(0) F(1) B(1) ...: forward then backward per microbatch, so
//   gradient accumulation holds one microbatch's activations at a time (Megatron's
//   forward_backward_no_pipelining).
// - k1F1B (v = 1): PipeDream-flush, Megatron's forward_backward_pipelining_without_interleaving.
//   Rank r runs w = min(p - r - 1, m) warmup forwards, m - w (forward, backward) pairs, then w
//   cooldown backwards; at most min(p - r, m) microbatches are in flight on rank r.
// - kInterleaved1F1B (p >= 2, v >= 2, m a multiple of p): Megatron's
//   forward_backward_pipelining_with_interleaving, microbatches in groups of p. Virtual step k
//   (0 <= k < m v) of the forward sequence is chunk (k mod pv) / p of microbatch
//   (k / pv) p + k mod p; the backward sequence is the same with chunk v - 1 - (k mod pv) / p. Rank
//   r runs w = min(2 (p - r - 1) + (v - 1) p, m v) warmup forwards, then (forward, backward) pairs,
//   then cooldown backwards. Receives sit where Megatron posts them: after its virtual step k,
//   rank 0 receives the activation the last rank sent after its step k - (p - 1) (none if that
//   was a last-chunk forward), and the last rank likewise the gradients from rank 0; the other
//   ranks receive the input of their next step.
//
// Communication rule for the runtime. A maximal run of adjacent communication actions (between
// two compute actions) is one batch: post all of it, then wait for all of it before the next
// compute action. NCCL: ncclGroupStart(), ncclSend / ncclRecv per action in list order,
// ncclGroupEnd() (stream-ordered). MPI: MPI_Isend / MPI_Irecv per action, then MPI_Waitall.
// Within a batch sends come first (activation, then gradient), then receives (same order).
// Guarantees (tests/pipeline/schedule_test.cc):
// - Pairing: every send has exactly one matching receive on its peer, and vice versa.
// - Order: for every ordered pair of ranks (a, b), the sends a -> b in a's list order are the
//   same messages as the receives from a in b's list order, so matching in posting order (NCCL
//   has no tags; MPI with one tag) pairs the right buffers, even at p = 2 where activations and
//   gradients travel between the same two ranks.
// - Dataflow: on each rank, a receive precedes the compute that consumes it, a send follows the
//   compute that produced it, and Forward(m, c) precedes Backward(m, c).
// - No deadlock under rendezvous semantics (an operation completes only once its partner is
//   posted; a batch once all of its operations have completed).
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace moe {

struct Action {
  enum class Kind { kForward, kBackward, kSendActivation, kRecvActivation, kSendGrad, kRecvGrad };

  Kind kind = Kind::kForward;
  int microbatch = 0;
  int chunk = 0;
  int peer_rank = -1;  // communication only: the rank sent to or received from

  bool is_communication() const { return kind != Kind::kForward && kind != Kind::kBackward; }
  bool is_send() const { return kind == Kind::kSendActivation || kind == Kind::kSendGrad; }
  // "F(m0,c1)", "SendAct(m0,c1)->r1", "RecvGrad(m2,c0)<-r3", ...
  std::string ToString() const;
  bool operator==(const Action&) const = default;
};

using RankActions = std::vector<Action>;

enum class ScheduleKind { kNoPipelining, k1F1B, kInterleaved1F1B };

const char* ScheduleKindName(ScheduleKind kind);  // "none", "1f1b", "interleaved_1f1b"
// The schedule for a layout: none for p = v = 1, 1F1B for v = 1, else interleaved 1F1B.
ScheduleKind DefaultScheduleKind(int pipeline_size, int virtual_chunks);

struct ScheduleSpec {
  int pipeline_size = 1;   // p, --pipeline_parallel
  int virtual_chunks = 1;  // v, --virtual_pipeline
  int microbatches = 1;    // m, per data-parallel replica and step
  ScheduleKind kind = ScheduleKind::kNoPipelining;
};

// One action list per pipeline rank. A Status error (naming the flags) when the spec does not
// fit the kind: sizes below 1; no pipelining with p or v above 1; 1F1B with v above 1;
// interleaved with p or v below 2 or m not a multiple of p.
StatusOr<std::vector<RankActions>> BuildSchedule(const ScheduleSpec& spec);
// Forward only (evaluation): every rank runs microbatch by microbatch, chunk by chunk,
// RecvActivation, Forward, SendActivation, so each (microbatch, chunk) flows through the stages
// in order. The same guarantees as above, without backwards. Sizes must be positive.
std::vector<RankActions> BuildForwardOnlySchedule(int pipeline_size, int virtual_chunks,
                                                  int microbatches);

struct MicrobatchChunk {
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const MicrobatchChunk&) const = default;
};

// The (microbatch, chunk) of each Backward, in the order the rank runs them.
std::vector<MicrobatchChunk> BackwardOrder(const RankActions& actions);
// The most (microbatch, chunk) pairs forwarded and not yet backwarded at any point on the rank:
// how many activation sets it holds at its peak.
int MaxInFlight(const RankActions& actions);

// One line, communication batches in braces: "F(m0,c0) {SendAct(m0,c0)->r1} F(m1,c0) ...".
std::string RankActionsToString(const RankActions& actions);
// "rank 0: ...\nrank 1: ...\n".
std::string ScheduleToString(const std::vector<RankActions>& schedule);

}  // namespace moe
