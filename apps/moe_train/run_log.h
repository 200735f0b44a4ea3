// What moe_train prints: the start-up summary, one line per log interval (and the same as one
// JSON object per line in --metrics_file), evaluation results. Under mpirun only rank 0 has a
// RunLog: losses, the gradient norm, the pipeline bubble and the step breakdown (means over
// ranks) and peak device memory (the largest step peak since the last line: the largest rank's,
// and every rank's; with a memory plan also its prediction) are global; offload
// figures are rank 0's. MFU is per device: the run's FLOP/s over its ranks, against one
// device's --peak_flops. A log line's time is the mean over the steps since the last one, split
// into the StepTimeline phases ("(fwd 40.2 bwd 70.1 opt 10.3 pp wait 0.0 dp wait 0.0 reload wait
// 0.0 ep wait 0.0 other 4.5)"; metrics fields forward_ms, backward_ms, optimizer_ms,
// pipeline_wait_ms, data_parallel_wait_ms, offload_wait_ms, expert_parallel_wait_ms, other_ms).
// Under expert parallelism a second line gives rank 0's expert group's load per step: the rows
// routed to each expert and received by each rank (min / median / max, summed over the MoE
// layers), the busiest rank of one exchange (one layer, one micro-batch) against the mean, and
// the bytes rank 0's all-to-alls sent.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "apps/moe_train/run_flags.h"
#include "engine/io/token_source.h"
#include "modules/memory_planner.h"

namespace moe {

class RunLog {
 public:
  explicit RunLog(const RunConfig& run);

  void Summary(const TokenSource& data, int64_t start_step) const;
  // Averages over the steps since the last call.
  void Step(int64_t step, const StepStats& stats);
  void Eval(int64_t step, double loss, std::optional<double> floor);
  // The offload policy table of every pipeline rank (Trainer::OffloadPolicyByPipelineRank).
  void OffloadPolicy(const OffloadManager& manager,
                     const std::vector<std::vector<OffloadGroupSummary>>& by_pipeline_rank);
  // A memory plan (--memory_budget_gib): later log lines show its predicted peak; `table`: print
  // its table.
  void Plan(const MemoryPlan& plan, bool table);

 private:
  void Metrics(const nlohmann::json& record);

  const RunConfig& run_;
  std::ofstream metrics_;
  bool metrics_lost_ = false;  // a write failed (said once)
  double seconds_ = 0;
  double bubble_ = 0;  // pipeline bubble fractions summed since the last log line
  int64_t tokens_ = 0;
  int steps_ = 0;
  OffloadStepStats offload_;      // summed since the last log line
  StepBreakdown breakdown_;       // summed since the last log line
  ExpertTraffic expert_traffic_;  // summed since the last log line
  // The largest (rows of a rank) / (mean rows per rank) of one exchange since the last log line.
  double busiest_exchange_ = 0;
  std::vector<double> peak_mib_;  // by world rank, the largest step peak since the last log line
  std::vector<double> predicted_peak_mib_;  // the memory plan's, by pipeline rank; empty: none
};

}  // namespace moe
