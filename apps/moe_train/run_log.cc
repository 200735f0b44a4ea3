#include "apps/moe_train/run_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/run_summary.h"
#include "apps/moe_train/throughput.h"
#include "engine/core/byte_units.h"
#include "modules/memory_estimate.h"

namespace moe {
namespace {

// The log line's names of the StepPhases, in their order (the metrics file uses StepPhaseName).
constexpr const char* kPhaseShortNames[kNumStepPhases] = {
    "fwd", "bwd", "opt", "pp wait", "dp wait", "reload wait", "ep wait", "other"};

void AddCounts(const std::vector<int64_t>& from, std::vector<int64_t>& to) {
  to.resize(std::max(to.size(), from.size()), 0);
  for (size_t i = 0; i < from.size(); ++i) to[i] += from[i];
}

// "min 120 median 256 max 410" of counts per step (`steps` summed), into record[key + "_min"]...
std::string Spread(std::vector<int64_t> counts, int steps, const std::string& key,
                   nlohmann::json& record) {
  std::sort(counts.begin(), counts.end());
  const size_t n = counts.size();
  const double min = static_cast<double>(counts.front()) / steps;
  const double median = static_cast<double>(counts[(n - 1) / 2] + counts[n / 2]) / 2 / steps;
  const double max = static_cast<double>(counts.back()) / steps;
  record[key + "_min"] = min;
  record[key + "_median"] = median;
  record[key + "_max"] = max;
  char text[96];
  snprintf(text, sizeof(text), "min %.0f median %.0f max %.0f", min, median, max);
  return text;
}

}  // namespace

RunLog::RunLog(const RunConfig& run) : run_(run) {
  if (!FLAGS_metrics_file.empty()) metrics_.open(FLAGS_metrics_file, std::ios::app);
}

// The file was checked before any work; losing it later (removed, a full disk) costs the metrics,
// said once on stderr, not the run.
void RunLog::Metrics(const nlohmann::json& record) {
  if (FLAGS_metrics_file.empty() || metrics_lost_) return;
  if (metrics_.is_open()) metrics_ << record.dump() << "\n" << std::flush;
  if (!metrics_.is_open() || !metrics_) {
    fprintf(stderr, "moe_train: --metrics_file %s could not be written; no more metrics go there\n",
            FLAGS_metrics_file.c_str());
    metrics_lost_ = true;
  }
}

void RunLog::Summary(const TokenSource& data, int64_t start_step) const {
  const GptConfig& m = run_.model;
  const TrainerOptions& t = run_.trainer;
  printf("moe_train: %s\n", PrecisionSummary(run_).c_str());
  printf("model: %s\n", ModelSummary(m).c_str());
  // Weights, gradients and AdamW state per parameter on each rank (memory_estimate.h), and what
  // that makes for the whole model (a pipeline rank holds its stages' share); under expert
  // parallelism the experts' apart: 1 / E of them on a rank, their state over the expert-data
  // group.
  MemoryEstimateOptions o;
  o.cuda = run_.device.is_cuda();
  o.state_shards = run_.state_shards();
  o.expert_parallel = run_.expert_parallel;
  o.dtypes = t.optimizer_dtypes;
  const int64_t shards = o.state_shards, e = o.expert_parallel;
  const double per_parameter = StateBytesPerParameter(o.cuda, shards, o.dtypes);
  const std::string sharded = shards > 1 ? " (master weights and moments sharded over " +
                                               std::to_string(shards) + " data ranks)"
                                         : "";
  const double experts = static_cast<double>(m.num_moe_layers() * m.num_experts) *
                         static_cast<double>(m.expert_parameters());
  const RankParameters whole{static_cast<double>(m.total_parameters()) - experts,
                             experts / static_cast<double>(e)};
  char expert_text[160] = "";
  if (e > 1) {
    const int64_t expert_shards = std::max<int64_t>(1, shards / e);
    const std::string expert_sharded =
        expert_shards > 1
            ? " (sharded over " + std::to_string(expert_shards) + " expert-data ranks)"
            : "";
    snprintf(expert_text, sizeof(expert_text),
             "; experts %.3g bytes/parameter, 1/%lld of them on each rank%s",
             RankStateBytes(o, {0, 1}).total(), (long long)e, expert_sharded.c_str());
  }
  printf(
      "parameters: %s; weights+grads+optimizer %.3g bytes/parameter on each rank%s%s: %.1f MiB per "
      "rank for the whole model%s\n",
      ParameterCounts(m).c_str(), per_parameter, sharded.c_str(), expert_text,
      RankStateBytes(o, whole).total() / kMiB,
      run_.pipeline_parallel > 1 ? " (a pipeline rank: its stages' share)" : "");
  printf("data: %s\n", data.Describe().c_str());
  if (auto floor = data.CrossEntropyFloor(m.seq_length)) {
    printf("data: entropy floor %.4f nats/token (the lowest reachable loss)\n", *floor);
  }
  printf("batch: %s\n", BatchSummary(run_).c_str());
  printf("parallel: %s\n", ParallelSummary(run_).c_str());
  // Flag values as they can be passed back (flag_table.h).
  printf("optimizer: AdamW, betas %s, %s, eps %s, weight decay %s, gradient clip %s\n",
         FlagValueText("adam_beta1").c_str(), FlagValueText("adam_beta2").c_str(),
         FlagValueText("adam_eps").c_str(), FlagValueText("weight_decay").c_str(),
         FlagValueText("clip_grad").c_str());
  printf("schedule: steps %lld from %lld, lr %s -> %s (warmup %lld, cosine)\n",
         (long long)t.train_steps, (long long)start_step, FlagValueText("lr").c_str(),
         FlagValueText("min_lr").c_str(), (long long)t.warmup_steps);
  if (t.offload) {
    std::string groups;
    for (const std::string& name : t.offload->groups) groups += (groups.empty() ? "" : ", ") + name;
    if (t.offload->planned) {
      printf(
          "offload: %s as the memory plan's candidates (tensors >= %lld bytes, prefetch %d "
          "layer(s))\n",
          groups.c_str(), (long long)t.offload->min_tensor_bytes, t.offload->prefetch_layers);
    } else {
      printf(
          "offload: %s (tensors >= %lld bytes, fraction %s, prefetch %d layer(s), pp delta "
          "%lld bytes)\n",
          groups.c_str(), (long long)t.offload->min_tensor_bytes,
          ShortestDouble(t.offload->fraction).c_str(), t.offload->prefetch_layers,
          (long long)t.offload->pp_delta_bytes);
    }
  }
  fflush(stdout);
}

void RunLog::Plan(const MemoryPlan& plan, bool table) {
  if (table) printf("%s", MemoryPlanTable(plan).c_str());
  fflush(stdout);
  predicted_peak_mib_.clear();
  for (const RankPlanSummary& rank : plan.ranks) {
    predicted_peak_mib_.push_back(rank.peak_bytes / kMiB);
  }
}

void RunLog::Step(int64_t step, const StepStats& stats) {
  seconds_ += stats.seconds;
  tokens_ += stats.tokens;
  bubble_ += stats.pipeline_bubble;
  ++steps_;
  offload_ += stats.offload;
  breakdown_ += stats.breakdown;
  AddCounts(stats.expert_traffic.rows_per_expert, expert_traffic_.rows_per_expert);
  AddCounts(stats.expert_traffic.rows_per_rank, expert_traffic_.rows_per_rank);
  expert_traffic_.bytes_sent += stats.expert_traffic.bytes_sent;
  const std::vector<int64_t>& exchanges = stats.expert_traffic.rows_per_exchange;
  const size_t ranks = stats.expert_traffic.rows_per_rank.size();
  for (size_t first = 0; ranks > 0 && first + ranks <= exchanges.size(); first += ranks) {
    int64_t sum = 0, most = 0;
    for (size_t r = first; r < first + ranks; ++r) {
      sum += exchanges[r];
      most = std::max(most, exchanges[r]);
    }
    if (sum > 0) {
      busiest_exchange_ = std::max(busiest_exchange_, static_cast<double>(most * ranks) / sum);
    }
  }
  peak_mib_.resize(stats.peak_device_mib.size(), 0.0);
  for (size_t r = 0; r < peak_mib_.size(); ++r) {
    peak_mib_[r] = std::max(peak_mib_[r], stats.peak_device_mib[r]);
  }
  if (step % FLAGS_log_interval != 0 && step != run_.trainer.train_steps) return;
  const double ms_per_step = 1e3 * seconds_ / steps_;
  const double tokens_per_second = tokens_ / seconds_;
  const double peak_mib = *std::max_element(peak_mib_.begin(), peak_mib_.end());
  printf("step %6lld | loss %.4f | aux %.4f | lr %.3e | grad norm %.3f | %.1f ms/step (",
         (long long)step, stats.loss, stats.aux_loss, stats.lr, stats.grad_norm, ms_per_step);
  nlohmann::json record = {
      {"step", step},   {"loss", stats.loss},           {"aux_loss", stats.aux_loss},
      {"lr", stats.lr}, {"grad_norm", stats.grad_norm}, {"ms_per_step", ms_per_step}};
  for (int i = 0; i < kNumStepPhases; ++i) {
    const auto phase = static_cast<StepPhase>(i);
    const double ms = breakdown_[phase] / steps_;
    printf("%s%s %.1f", i == 0 ? "" : " ", kPhaseShortNames[i], ms);
    record[std::string(StepPhaseName(phase)) + "_ms"] = ms;
  }
  printf(") | %.0f tokens/s", tokens_per_second);
  record["tokens_per_second"] = tokens_per_second;
  record["peak_device_mib"] = peak_mib;
  if (run_.device.is_cuda()) {
    const int devices = run_.pipeline_parallel * run_.data_parallel;
    const double mfu = MfuPerDevice(tokens_per_second, run_.model.train_flops_per_token(), devices,
                                    FLAGS_peak_flops);
    printf(" | MFU %.1f%%", 100 * mfu);
    record["mfu"] = mfu;  // per device
  }
  printf(" | peak mem %.0f MiB", peak_mib);
  if (!predicted_peak_mib_.empty()) {
    const double predicted =
        *std::max_element(predicted_peak_mib_.begin(), predicted_peak_mib_.end());
    printf(" (plan %.0f MiB, budget %.0f MiB)", predicted, run_.memory_budget->bytes / kMiB);
    record["predicted_peak_device_mib"] = predicted;
    record["predicted_peak_device_mib_by_pipeline_rank"] = predicted_peak_mib_;
  }
  if (peak_mib_.size() > 1) {
    std::string by_rank;
    for (double mib : peak_mib_) {
      if (!by_rank.empty()) by_rank += '/';
      by_rank += std::to_string(std::lround(mib));
    }
    printf(" (by rank %s)", by_rank.c_str());
    record["peak_device_mib_by_rank"] = peak_mib_;
  }
  if (run_.pipeline_parallel > 1) {
    const double bubble = bubble_ / steps_;
    const double micro_batches = static_cast<double>(run_.trainer.global_batch_size) /
                                 (run_.trainer.micro_batch_size * run_.data_parallel);
    // (p - 1) / (v m + p - 1): p stages, m micro-batches, v chunks per rank (1F1B: v = 1).
    const double p = run_.pipeline_parallel;
    const double theory = (p - 1) / (run_.trainer.virtual_pipeline * micro_batches + p - 1);
    printf(" | bubble %.1f%% (theory %.1f%%)", 100 * bubble, 100 * theory);
    record["pipeline_bubble"] = bubble;
    record["pipeline_bubble_theory"] = theory;
  }
  printf("\n");
  if (run_.trainer.offload) {
    const double out_mib = offload_.offloaded_bytes / kMiB / steps_;
    const double in_mib = offload_.reloaded_bytes / kMiB / steps_;
    const double wait_ms = breakdown_[StepPhase::kOffloadWait] / steps_;
    printf(
        "            offload | out %.1f MiB/step (%lld tensors) | in %.1f MiB/step | D2H %.2f GB/s "
        "| H2D %.2f GB/s | reload wait %.2f ms/step\n",
        out_mib, (long long)(offload_.offloaded_tensors / steps_), in_mib, offload_.d2h_gbps(),
        offload_.h2d_gbps(), wait_ms);
    record["offload_bytes_per_step"] = offload_.offloaded_bytes / steps_;
    record["reload_bytes_per_step"] = offload_.reloaded_bytes / steps_;
    record["offload_d2h_gbps"] = offload_.d2h_gbps();
    record["offload_h2d_gbps"] = offload_.h2d_gbps();
  }
  if (!expert_traffic_.rows_per_expert.empty()) {
    const std::string experts =
        Spread(expert_traffic_.rows_per_expert, steps_, "expert_rows", record);
    const std::string ranks = Spread(expert_traffic_.rows_per_rank, steps_, "rank_rows", record);
    const double sent_mib = static_cast<double>(expert_traffic_.bytes_sent) / kMiB / steps_;
    printf(
        "            experts | rows per expert %s | rows per rank %s | busiest rank of an "
        "exchange %.2fx the mean | all-to-all out %.2f MiB/step | ep wait %.2f ms/step\n",
        experts.c_str(), ranks.c_str(), busiest_exchange_, sent_mib,
        breakdown_[StepPhase::kExpertParallelWait] / steps_);
    record["expert_exchange_bytes_per_step"] = expert_traffic_.bytes_sent / steps_;
    record["expert_busiest_exchange_ratio"] = busiest_exchange_;
  }
  fflush(stdout);
  Metrics(record);
  offload_ = {};
  expert_traffic_ = {};
  busiest_exchange_ = 0;
  breakdown_ = {};
  bubble_ = 0;
  seconds_ = 0;
  tokens_ = 0;
  steps_ = 0;
  peak_mib_.clear();
}

void RunLog::Eval(int64_t step, double loss, std::optional<double> floor) {
  printf("eval step %6lld | validation loss %.4f", (long long)step, loss);
  nlohmann::json record = {{"step", step}, {"val_loss", loss}};
  if (floor) {
    printf(" | floor %.4f | gap %.4f", *floor, loss - *floor);
    record["entropy_floor"] = *floor;
  }
  printf("\n");
  fflush(stdout);
  Metrics(record);
}

void RunLog::OffloadPolicy(const OffloadManager& manager,
                           const std::vector<std::vector<OffloadGroupSummary>>& by_pipeline_rank) {
  printf("%s", manager.SummaryTable(by_pipeline_rank).c_str());
  fflush(stdout);
}

}  // namespace moe
