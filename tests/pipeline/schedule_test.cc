// Pipeline schedules: the exact action lists of small cases (no pipelining, 1F1B, Megatron's
// interleaved 1F1B written out by hand from its algorithm), and properties of every
// (p, v, m) with p in 1..4, v in 1..3, m in 1..4p where the kind allows it: coverage, dataflow,
// send/receive pairing and per-channel order, in-flight bounds, and a simulated execution.
//
// The simulator (Simulate) runs all ranks' lists with rendezvous semantics, the strictest the
// runtime may see: a maximal run of adjacent communication actions is one batch, posted when the
// rank reaches it; an operation completes only when its partner operation (same message) is in
// the batch its peer has currently posted; a batch completes, and its rank moves on, once all of
// its operations have completed. Compute costs forward 1/v and backward 2/v (one microbatch
// through a whole rank costs 1 + 2); communication is free. The run deadlocks if some rank can
// never finish. Its makespan gives the bubble fraction 1 - (busy time) / makespan.
#include "engine/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace moe {
namespace {

using Kind = Action::Kind;

std::vector<RankActions> Build(int p, int v, int m, ScheduleKind kind) {
  StatusOr<std::vector<RankActions>> schedule = BuildSchedule({p, v, m, kind});
  CHECK(schedule.ok()) << schedule.status().ToString();
  CHECK_EQ(static_cast<int>(schedule->size()), p);
  return std::move(schedule).value();
}

struct Case {
  int p, v, m;
  ScheduleKind kind;
  std::string Name() const {
    return std::string(ScheduleKindName(kind)) + " p=" + std::to_string(p) +
           " v=" + std::to_string(v) + " m=" + std::to_string(m);
  }
};

// Every valid spec with p in 1..4, v in 1..3, m in 1..4p, under its default kind; plus 1F1B at
// p = 1 (the same order as no pipelining).
std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      if (p == 1 && v > 1) continue;  // no interleaving without a pipeline
      for (int m = 1; m <= 4 * p; ++m) {
        const ScheduleKind kind = DefaultScheduleKind(p, v);
        if (kind == ScheduleKind::kInterleaved1F1B && m % p != 0) continue;
        cases.push_back({p, v, m, kind});
        if (p == 1) cases.push_back({p, v, m, ScheduleKind::k1F1B});
      }
    }
  }
  return cases;
}

// The compute actions of a rank as "F(m0,c0) B(m0,c0) ...".
std::string ComputeOrder(const RankActions& actions) {
  std::string out;
  for (const Action& a : actions) {
    if (a.is_communication()) continue;
    if (!out.empty()) out += " ";
    out += a.ToString();
  }
  return out;
}

// A message: an activation leaving `from_stage` forward, or a gradient leaving it backward.
using Message = std::tuple<bool /*grad*/, int /*from_stage*/, int /*microbatch*/>;

Message MessageOf(const Action& a, int rank, int p) {
  const int stage = a.chunk * p + rank;
  switch (a.kind) {
    case Kind::kSendActivation:
      return {false, stage, a.microbatch};
    case Kind::kRecvActivation:
      return {false, stage - 1, a.microbatch};
    case Kind::kSendGrad:
      return {true, stage, a.microbatch};
    case Kind::kRecvGrad:
      return {true, stage + 1, a.microbatch};
    default:
      break;
  }
  ADD_FAILURE() << "not a communication action: " << a.ToString();
  return {};
}

// The rank a message of `a` must go to or come from.
int ExpectedPeer(const Action& a, int rank, int p) {
  const auto [grad, from_stage, m] = MessageOf(a, rank, p);
  const int to_stage = grad ? from_stage - 1 : from_stage + 1;
  return (a.is_send() ? to_stage : from_stage) % p;
}

TEST(ScheduleTest, NoPipeliningAlternatesForwardAndBackward) {
  const std::vector<RankActions> s = Build(1, 1, 3, ScheduleKind::kNoPipelining);
  EXPECT_EQ(ScheduleToString(s), "rank 0: F(m0,c0) B(m0,c0) F(m1,c0) B(m1,c0) F(m2,c0) B(m2,c0)\n");
  EXPECT_EQ(MaxInFlight(s[0]), 1);
  EXPECT_EQ(Build(1, 1, 3, ScheduleKind::k1F1B), s);
}

TEST(ScheduleTest, OneFOneBTwoStages) {
  const std::vector<RankActions> s = Build(2, 1, 3, ScheduleKind::k1F1B);
  EXPECT_EQ(RankActionsToString(s[0]),
            "F(m0,c0) {SendAct(m0,c0)->r1} F(m1,c0) {SendAct(m1,c0)->r1 RecvGrad(m0,c0)<-r1} "
            "B(m0,c0) F(m2,c0) {SendAct(m2,c0)->r1 RecvGrad(m1,c0)<-r1} B(m1,c0) "
            "{RecvGrad(m2,c0)<-r1} B(m2,c0)");
  EXPECT_EQ(RankActionsToString(s[1]),
            "{RecvAct(m0,c0)<-r0} F(m0,c0) B(m0,c0) {SendGrad(m0,c0)->r0 RecvAct(m1,c0)<-r0} "
            "F(m1,c0) B(m1,c0) {SendGrad(m1,c0)->r0 RecvAct(m2,c0)<-r0} F(m2,c0) B(m2,c0) "
            "{SendGrad(m2,c0)->r0}");
  EXPECT_EQ(BackwardOrder(s[1]), (std::vector<MicrobatchChunk>{{0, 0}, {1, 0}, {2, 0}}));
}

TEST(ScheduleTest, OneFOneBWarmupSteadyCooldown) {
  const std::vector<RankActions> s = Build(4, 1, 6, ScheduleKind::k1F1B);
  EXPECT_EQ(ComputeOrder(s[0]),
            "F(m0,c0) F(m1,c0) F(m2,c0) F(m3,c0) B(m0,c0) F(m4,c0) B(m1,c0) F(m5,c0) B(m2,c0) "
            "B(m3,c0) B(m4,c0) B(m5,c0)");
  EXPECT_EQ(ComputeOrder(s[2]),
            "F(m0,c0) F(m1,c0) B(m0,c0) F(m2,c0) B(m1,c0) F(m3,c0) B(m2,c0) F(m4,c0) B(m3,c0) "
            "F(m5,c0) B(m4,c0) B(m5,c0)");
  EXPECT_EQ(ComputeOrder(s[3]),
            "F(m0,c0) B(m0,c0) F(m1,c0) B(m1,c0) F(m2,c0) B(m2,c0) F(m3,c0) B(m3,c0) F(m4,c0) "
            "B(m4,c0) F(m5,c0) B(m5,c0)");
  // Fewer microbatches than stages: all forwards, then all backwards.
  EXPECT_EQ(ComputeOrder(Build(4, 1, 2, ScheduleKind::k1F1B)[0]),
            "F(m0,c0) F(m1,c0) B(m0,c0) B(m1,c0)");
}

// Megatron's interleaved schedule for p = 2, v = 2, m = 4, worked by hand. Virtual steps k = 0..7
// run forward (m, c) = (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1) and backward (0,1) (1,1)
// (0,0) (1,0) (2,1) (3,1) (2,0) (3,0). Rank 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards,
// rank 1 with 2. Rank 0 receives after forward step k the activation rank 1 sent after its step
// k - 1 (none when that was a last-chunk forward); rank 1 likewise for gradients from rank 0.
TEST(ScheduleTest, InterleavedMatchesMegatron) {
  const std::vector<RankActions> s = Build(2, 2, 4, ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(ComputeOrder(s[0]),
            "F(m0,c0) F(m1,c0) F(m0,c1) F(m1,c1) F(m2,c0) B(m0,c1) F(m3,c0) B(m1,c1) F(m2,c1) "
            "B(m0,c0) F(m3,c1) B(m1,c0) B(m2,c1) B(m3,c1) B(m2,c0) B(m3,c0)");
  EXPECT_EQ(ComputeOrder(s[1]),
            "F(m0,c0) F(m1,c0) F(m0,c1) B(m0,c1) F(m1,c1) B(m1,c1) F(m2,c0) B(m0,c0) F(m3,c0) "
            "B(m1,c0) F(m2,c1) B(m2,c1) F(m3,c1) B(m3,c1) B(m2,c0) B(m3,c0)");
  EXPECT_EQ(RankActionsToString(s[0]),
            "F(m0,c0) {SendAct(m0,c0)->r1} "
            "F(m1,c0) {SendAct(m1,c0)->r1 RecvAct(m0,c1)<-r1} "
            "F(m0,c1) {SendAct(m0,c1)->r1 RecvAct(m1,c1)<-r1} "
            "F(m1,c1) {SendAct(m1,c1)->r1 RecvGrad(m0,c1)<-r1} "
            "F(m2,c0) B(m0,c1) {SendAct(m2,c0)->r1 SendGrad(m0,c1)->r1 RecvGrad(m1,c1)<-r1} "
            "F(m3,c0) B(m1,c1) {SendAct(m3,c0)->r1 SendGrad(m1,c1)->r1 RecvAct(m2,c1)<-r1 "
            "RecvGrad(m0,c0)<-r1} "
            "F(m2,c1) B(m0,c0) {SendAct(m2,c1)->r1 RecvAct(m3,c1)<-r1 RecvGrad(m1,c0)<-r1} "
            "F(m3,c1) B(m1,c0) {SendAct(m3,c1)->r1 RecvGrad(m2,c1)<-r1} "
            "B(m2,c1) {SendGrad(m2,c1)->r1 RecvGrad(m3,c1)<-r1} "
            "B(m3,c1) {SendGrad(m3,c1)->r1 RecvGrad(m2,c0)<-r1} "
            "B(m2,c0) {RecvGrad(m3,c0)<-r1} B(m3,c0)");
  EXPECT_EQ(RankActionsToString(s[1]),
            "{RecvAct(m0,c0)<-r0} "
            "F(m0,c0) {SendAct(m0,c0)->r0 RecvAct(m1,c0)<-r0} "
            "F(m1,c0) {SendAct(m1,c0)->r0 RecvAct(m0,c1)<-r0} "
            "F(m0,c1) B(m0,c1) {SendGrad(m0,c1)->r0 RecvAct(m1,c1)<-r0} "
            "F(m1,c1) B(m1,c1) {SendGrad(m1,c1)->r0 RecvAct(m2,c0)<-r0 RecvGrad(m0,c0)<-r0} "
            "F(m2,c0) B(m0,c0) {SendAct(m2,c0)->r0 SendGrad(m0,c0)->r0 RecvAct(m3,c0)<-r0 "
            "RecvGrad(m1,c0)<-r0} "
            "F(m3,c0) B(m1,c0) {SendAct(m3,c0)->r0 SendGrad(m1,c0)->r0 RecvAct(m2,c1)<-r0} "
            "F(m2,c1) B(m2,c1) {SendGrad(m2,c1)->r0 RecvAct(m3,c1)<-r0} "
            "F(m3,c1) B(m3,c1) {SendGrad(m3,c1)->r0 RecvGrad(m2,c0)<-r0} "
            "B(m2,c0) {SendGrad(m2,c0)->r0 RecvGrad(m3,c0)<-r0} "
            "B(m3,c0) {SendGrad(m3,c0)->r0}");
  EXPECT_EQ(BackwardOrder(s[0]),
            (std::vector<MicrobatchChunk>{
                {0, 1}, {1, 1}, {0, 0}, {1, 0}, {2, 1}, {3, 1}, {2, 0}, {3, 0}}));
  EXPECT_EQ(BackwardOrder(s[1]), BackwardOrder(s[0]));
}

// m = p: rank 0's warmup covers every forward (Megatron's are_all_microbatches_in_warmup).
TEST(ScheduleTest, InterleavedAllWarmup) {
  const std::vector<RankActions> s = Build(2, 2, 2, ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(ComputeOrder(s[0]),
            "F(m0,c0) F(m1,c0) F(m0,c1) F(m1,c1) B(m0,c1) B(m1,c1) B(m0,c0) B(m1,c0)");
  EXPECT_EQ(ComputeOrder(s[1]),
            "F(m0,c0) F(m1,c0) F(m0,c1) B(m0,c1) F(m1,c1) B(m1,c1) B(m0,c0) B(m1,c0)");
}

TEST(ScheduleTest, ErrorsNameTheFlags) {
  auto error = [](ScheduleSpec spec) {
    StatusOr<std::vector<RankActions>> s = BuildSchedule(spec);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : s.status().message();
  };
  const std::string not_multiple = error({4, 2, 6, ScheduleKind::kInterleaved1F1B});
  EXPECT_NE(not_multiple.find("--global_batch_size"), std::string::npos) << not_multiple;
  EXPECT_NE(not_multiple.find("--micro_batch_size"), std::string::npos) << not_multiple;
  EXPECT_NE(not_multiple.find("--pipeline_parallel=4"), std::string::npos) << not_multiple;
  EXPECT_NE(error({4, 2, 2, ScheduleKind::kInterleaved1F1B}).find("multiple"), std::string::npos);
  EXPECT_NE(error({1, 2, 4, ScheduleKind::kInterleaved1F1B}).find("--pipeline_parallel >= 2"),
            std::string::npos);
  EXPECT_NE(error({2, 1, 4, ScheduleKind::kInterleaved1F1B}).find("--virtual_pipeline >= 2"),
            std::string::npos);
  EXPECT_NE(error({2, 2, 4, ScheduleKind::k1F1B}).find("--virtual_pipeline=2"), std::string::npos);
  EXPECT_NE(error({2, 1, 4, ScheduleKind::kNoPipelining}).find("one stage"), std::string::npos);
  EXPECT_NE(error({0, 1, 4, ScheduleKind::k1F1B}).find("--pipeline_parallel"), std::string::npos);
  EXPECT_NE(error({1, 0, 4, ScheduleKind::k1F1B}).find("--virtual_pipeline"), std::string::npos);
  EXPECT_NE(error({2, 1, 0, ScheduleKind::k1F1B}).find("microbatch"), std::string::npos);
}

TEST(ScheduleTest, DefaultKind) {
  EXPECT_EQ(DefaultScheduleKind(1, 1), ScheduleKind::kNoPipelining);
  EXPECT_EQ(DefaultScheduleKind(4, 1), ScheduleKind::k1F1B);
  EXPECT_EQ(DefaultScheduleKind(4, 2), ScheduleKind::kInterleaved1F1B);
}

// Each rank runs Forward and Backward of every (m, c) exactly once, forward first.
TEST(ScheduleTest, EveryForwardAndBackwardOnceForwardFirst) {
  for (const Case& c : AllCases()) {
    const std::vector<RankActions> s = Build(c.p, c.v, c.m, c.kind);
    for (int r = 0; r < c.p; ++r) {
      std::map<std::pair<int, int>, int> forward_at, backward_at;
      for (int i = 0; i < static_cast<int>(s[r].size()); ++i) {
        const Action& a = s[r][i];
        if (a.is_communication()) continue;
        auto& seen = a.kind == Kind::kForward ? forward_at : backward_at;
        EXPECT_TRUE(seen.emplace(std::pair{a.microbatch, a.chunk}, i).second)
            << c.Name() << " rank " << r << ": twice " << a.ToString();
      }
      ASSERT_EQ(static_cast<int>(forward_at.size()), c.m * c.v) << c.Name() << " rank " << r;
      ASSERT_EQ(static_cast<int>(backward_at.size()), c.m * c.v) << c.Name() << " rank " << r;
      for (int m = 0; m < c.m; ++m) {
        for (int chunk = 0; chunk < c.v; ++chunk) {
          ASSERT_TRUE(forward_at.count({m, chunk}) && backward_at.count({m, chunk}))
              << c.Name() << " rank " << r << " misses m" << m << " c" << chunk;
          const std::pair<int, int> key{m, chunk};
          EXPECT_LT(forward_at[key], backward_at[key])
              << c.Name() << " rank " << r << " m" << m << " c" << chunk;
        }
      }
    }
  }
}

// Receives precede the compute that consumes them and sends follow the compute that produced
// them; the first stage receives no activation and sends no gradient, the last stage sends no
// activation and receives no gradient.
TEST(ScheduleTest, Dataflow) {
  for (const Case& c : AllCases()) {
    const std::vector<RankActions> s = Build(c.p, c.v, c.m, c.kind);
    const int last_stage = c.p * c.v - 1;
    for (int r = 0; r < c.p; ++r) {
      std::set<std::tuple<Kind, int, int>> done;
      for (const Action& a : s[r]) {
        const int stage = a.chunk * c.p + r;
        auto was_done = [&](Kind kind) { return done.count({kind, a.microbatch, a.chunk}) > 0; };
        const std::string where = c.Name() + " rank " + std::to_string(r) + ": " + a.ToString();
        switch (a.kind) {
          case Kind::kForward:
            EXPECT_EQ(stage == 0 || was_done(Kind::kRecvActivation), true) << where;
            break;
          case Kind::kBackward:
            EXPECT_TRUE(was_done(Kind::kForward)) << where;
            EXPECT_EQ(stage == last_stage || was_done(Kind::kRecvGrad), true) << where;
            break;
          case Kind::kSendActivation:
            EXPECT_NE(stage, last_stage) << where;
            EXPECT_TRUE(was_done(Kind::kForward)) << where;
            break;
          case Kind::kSendGrad:
            EXPECT_NE(stage, 0) << where;
            EXPECT_TRUE(was_done(Kind::kBackward)) << where;
            break;
          case Kind::kRecvActivation:
            EXPECT_NE(stage, 0) << where;
            break;
          case Kind::kRecvGrad:
            EXPECT_NE(stage, last_stage) << where;
            break;
        }
        if (a.is_communication()) {
          EXPECT_EQ(a.peer_rank, ExpectedPeer(a, r, c.p)) << where;
        }
        EXPECT_TRUE(done.insert({a.kind, a.microbatch, a.chunk}).second) << "twice: " << where;
      }
    }
  }
}

// Every send has exactly one receive of the same message on its peer, and for every ordered pair
// of ranks the messages sent and received appear in the same order (matching in posting order
// is correct). Within a batch: sends (activation, then gradient), then receives (same order).
TEST(ScheduleTest, SendsAndReceivesPairInOrder) {
  auto batch_position = [](Kind kind) {
    switch (kind) {
      case Kind::kSendActivation:
        return 0;
      case Kind::kSendGrad:
        return 1;
      case Kind::kRecvActivation:
        return 2;
      case Kind::kRecvGrad:
        return 3;
      default:
        return -1;
    }
  };
  for (const Case& c : AllCases()) {
    const std::vector<RankActions> s = Build(c.p, c.v, c.m, c.kind);
    for (int r = 0; r < c.p; ++r) {
      for (size_t i = 1; i < s[r].size(); ++i) {
        if (s[r][i - 1].is_communication() && s[r][i].is_communication()) {
          EXPECT_LT(batch_position(s[r][i - 1].kind), batch_position(s[r][i].kind))
              << c.Name() << " rank " << r << ": " << RankActionsToString(s[r]);
        }
      }
    }
    std::map<std::pair<int, int>, std::vector<Message>> sent, received;  // by (from, to)
    for (int r = 0; r < c.p; ++r) {
      for (const Action& a : s[r]) {
        if (!a.is_communication()) continue;
        if (a.is_send()) {
          sent[{r, a.peer_rank}].push_back(MessageOf(a, r, c.p));
        } else {
          received[{a.peer_rank, r}].push_back(MessageOf(a, r, c.p));
        }
      }
    }
    EXPECT_EQ(sent, received) << c.Name() << "\n" << ScheduleToString(s);
    // Every boundary message exists once: activations of all stages but the last, gradients of
    // all stages but the first, for every microbatch.
    std::set<Message> all;
    for (const auto& [channel, messages] : sent) all.insert(messages.begin(), messages.end());
    size_t count = 0;
    for (const auto& [channel, messages] : sent) count += messages.size();
    EXPECT_EQ(count, all.size()) << c.Name();
    EXPECT_EQ(static_cast<int>(all.size()), 2 * c.m * (c.p * c.v - 1)) << c.Name();
  }
}

TEST(ScheduleTest, InFlightBounds) {
  for (const Case& c : AllCases()) {
    const std::vector<RankActions> s = Build(c.p, c.v, c.m, c.kind);
    for (int r = 0; r < c.p; ++r) {
      if (c.v == 1) {
        EXPECT_EQ(MaxInFlight(s[r]), std::min(c.p - r, c.m)) << c.Name() << " rank " << r;
      } else {  // Megatron's warmup plus the one forward of a steady step
        const int warmup = 2 * (c.p - r - 1) + (c.v - 1) * c.p;
        EXPECT_EQ(MaxInFlight(s[r]), std::min(warmup + 1, c.m * c.v)) << c.Name() << " rank " << r;
      }
    }
  }
}

struct SimResult {
  bool deadlocked = false;
  double makespan = 0;
  std::string stuck;  // where each rank stopped, on deadlock
};

SimResult Simulate(const std::vector<RankActions>& s, int p, int v) {
  const int ranks = static_cast<int>(s.size());
  // Steps: [begin, end) ranges of one compute action or one batch of communication actions.
  std::vector<std::vector<std::pair<int, int>>> steps(ranks);
  std::map<std::pair<Message, bool>, std::pair<int, int>> where;  // (message, is_send) -> (rank, i)
  for (int r = 0; r < ranks; ++r) {
    const int n = static_cast<int>(s[r].size());
    for (int i = 0; i < n;) {
      int j = i + 1;
      if (s[r][i].is_communication()) {
        while (j < n && s[r][j].is_communication()) ++j;
      }
      steps[r].push_back({i, j});
      i = j;
    }
    for (int i = 0; i < n; ++i) {
      if (s[r][i].is_communication()) where[{MessageOf(s[r][i], r, p), s[r][i].is_send()}] = {r, i};
    }
  }
  std::vector<int> step(ranks, 0);
  std::vector<double> clock(ranks, 0), posted_at(ranks, -1);
  std::vector<std::vector<double>> matched_at(ranks);
  for (int r = 0; r < ranks; ++r) matched_at[r].assign(s[r].size(), -1);
  auto done = [&](int r) { return step[r] == static_cast<int>(steps[r].size()); };
  auto is_posted = [&](int r, int i) {
    return !done(r) && posted_at[r] >= 0 && steps[r][step[r]].first <= i &&
           i < steps[r][step[r]].second;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      while (!done(r)) {
        const auto [begin, end] = steps[r][step[r]];
        const Action& first = s[r][begin];
        if (!first.is_communication()) {
          clock[r] += (first.kind == Kind::kForward ? 1.0 : 2.0) / v;
          ++step[r];
          progress = true;
          continue;
        }
        if (posted_at[r] < 0) {
          posted_at[r] = clock[r];
          progress = true;
        }
        bool complete = true;
        double finish = posted_at[r];
        for (int i = begin; i < end; ++i) {
          if (matched_at[r][i] < 0) {
            const auto [peer, j] = where.at({MessageOf(s[r][i], r, p), !s[r][i].is_send()});
            if (!is_posted(peer, j)) {
              complete = false;
              continue;
            }
            matched_at[r][i] = matched_at[peer][j] = std::max(posted_at[r], posted_at[peer]);
          }
          finish = std::max(finish, matched_at[r][i]);
        }
        if (!complete) break;
        clock[r] = finish;
        posted_at[r] = -1;
        ++step[r];
        progress = true;
      }
    }
  }
  SimResult result;
  for (int r = 0; r < ranks; ++r) {
    result.makespan = std::max(result.makespan, clock[r]);
    if (!done(r)) {
      result.deadlocked = true;
      result.stuck += "rank " + std::to_string(r) + " at action " +
                      s[r][steps[r][step[r]].first].ToString() + "\n";
    }
  }
  return result;
}

// The simulator itself: a hand-made pair of lists that completes, and one that cannot (rank 0
// waits for the gradient before sending the activation that rank 1 waits for).
TEST(ScheduleTest, SimulatorFindsDeadlocks) {
  const Action f{Kind::kForward, 0, 0, -1}, b{Kind::kBackward, 0, 0, -1};
  const Action send_act{Kind::kSendActivation, 0, 0, 1}, recv_act{Kind::kRecvActivation, 0, 0, 0};
  const Action send_grad{Kind::kSendGrad, 0, 0, 0}, recv_grad{Kind::kRecvGrad, 0, 0, 1};
  const RankActions rank0 = {f, send_act, recv_grad, b};
  const SimResult good = Simulate({rank0, {recv_act, f, b, send_grad}}, 2, 1);
  EXPECT_FALSE(good.deadlocked) << good.stuck;
  EXPECT_DOUBLE_EQ(good.makespan, 6.0);  // F, F and B on rank 1, B
  const SimResult bad = Simulate({{recv_grad, f, send_act, b}, {recv_act, f, b, send_grad}}, 2, 1);
  EXPECT_TRUE(bad.deadlocked);
  EXPECT_EQ(bad.stuck,
            "rank 0 at action RecvGrad(m0,c0)<-r1\nrank 1 at action RecvAct(m0,c0)<-r0\n");
}

TEST(ScheduleTest, SimulationNeverDeadlocks) {
  for (const Case& c : AllCases()) {
    const std::vector<RankActions> s = Build(c.p, c.v, c.m, c.kind);
    const SimResult result = Simulate(s, c.p, c.v);
    EXPECT_FALSE(result.deadlocked) << c.Name() << "\n" << result.stuck << ScheduleToString(s);
  }
}

// Evaluation's forward-only lists: every rank forwards each (microbatch, chunk) once in
// (microbatch, chunk) order, every activation boundary is crossed once with sends and receives
// pairing in order, and the lists run without deadlock.
TEST(ScheduleTest, ForwardOnly) {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      if (p == 1 && v > 1) continue;
      for (int m = 1; m <= 4; ++m) {
        const std::string name =
            "p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m);
        const std::vector<RankActions> s = BuildForwardOnlySchedule(p, v, m);
        ASSERT_EQ(static_cast<int>(s.size()), p) << name;
        std::string expected;
        for (int i = 0; i < m; ++i) {
          for (int c = 0; c < v; ++c) {
            if (!expected.empty()) expected += " ";
            expected += Action{Kind::kForward, i, c, -1}.ToString();
          }
        }
        std::map<std::pair<int, int>, std::vector<Message>> sent, received;  // by (from, to)
        size_t messages = 0;
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(ComputeOrder(s[r]), expected) << name << " rank " << r;
          for (const Action& a : s[r]) {
            if (!a.is_communication()) continue;
            EXPECT_TRUE(a.kind == Kind::kSendActivation || a.kind == Kind::kRecvActivation) << name;
            EXPECT_EQ(a.peer_rank, ExpectedPeer(a, r, p)) << name;
            if (a.is_send()) {
              sent[{r, a.peer_rank}].push_back(MessageOf(a, r, p));
              ++messages;
            } else {
              received[{a.peer_rank, r}].push_back(MessageOf(a, r, p));
            }
          }
        }
        EXPECT_EQ(sent, received) << name << "\n" << ScheduleToString(s);
        EXPECT_EQ(static_cast<int>(messages), m * (p * v - 1)) << name;
        const SimResult result = Simulate(s, p, v);
        EXPECT_FALSE(result.deadlocked) << name << "\n" << result.stuck << ScheduleToString(s);
      }
    }
  }
}

// With forward 1 and backward 2 per microbatch and rank, 1F1B's bubble is (p - 1) / (m + p - 1)
// of the step; interleaving divides the fill/drain by v: (p - 1) / (v m + p - 1).
TEST(ScheduleTest, BubbleFraction) {
  for (const Case& c : AllCases()) {
    const std::vector<RankActions> s = Build(c.p, c.v, c.m, c.kind);
    const SimResult result = Simulate(s, c.p, c.v);
    ASSERT_FALSE(result.deadlocked) << c.Name();
    const double busy = 3.0 * c.m;
    const double bubble = 1.0 - busy / result.makespan;
    const double expected =
        c.v == 1 ? double(c.p - 1) / (c.m + c.p - 1) : double(c.p - 1) / (c.v * c.m + c.p - 1);
    EXPECT_NEAR(bubble, expected, 1e-9) << c.Name() << " makespan " << result.makespan;
  }
}

TEST(ScheduleTest, ToStrings) {
  EXPECT_EQ((Action{Kind::kForward, 2, 1, -1}).ToString(), "F(m2,c1)");
  EXPECT_EQ((Action{Kind::kBackward, 0, 0, -1}).ToString(), "B(m0,c0)");
  EXPECT_EQ((Action{Kind::kSendActivation, 1, 0, 3}).ToString(), "SendAct(m1,c0)->r3");
  EXPECT_EQ((Action{Kind::kRecvActivation, 1, 0, 2}).ToString(), "RecvAct(m1,c0)<-r2");
  EXPECT_EQ((Action{Kind::kSendGrad, 1, 2, 0}).ToString(), "SendGrad(m1,c2)->r0");
  EXPECT_EQ((Action{Kind::kRecvGrad, 4, 1, 1}).ToString(), "RecvGrad(m4,c1)<-r1");
  EXPECT_STREQ(ScheduleKindName(ScheduleKind::kInterleaved1F1B), "interleaved_1f1b");
}

}  // namespace
}  // namespace moe
