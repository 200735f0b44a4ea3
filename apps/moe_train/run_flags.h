// moe_train's flags: defined in run_flags.cc, checked all together before any work.
// ValidateFlags returns the first problem as one line naming the flag(s), in this order: every
// numeric flag within its documented range (flag_table.h), no flag set whose feature is off
// (flag_rules.h), the relations between flags (model shape, batch, learning rates), outputs
// (apps/common/output_checks.h), the layout against the world size (the layer split and the batch
// split are Trainer::Create's), data format, device, offloading, and the checkpoint to resume from
// (resume_check.h). Memory (memory_check.h) needs the device and is checked by main.
// A dry run (`dry_run`, dry_run.h) checks the flags of a run on another machine: `world_size` is
// --dry_run_world_size, the device named is assumed present (--device=auto is a GPU there), and
// what names that machine's files (outputs, --load) is not looked at.
// --warmup_steps longer than the run is clamped to --train_steps (a smoke run of a preset with
// --train_steps=5 then runs), with a note that main prints.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gflags/gflags.h>

#include "apps/moe_train/offload_flags.h"
#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/io/dataset.h"
#include "modules/gpt_config.h"
#include "modules/trainer.h"

DECLARE_int64(num_layers);
DECLARE_int64(first_dense_layers);
DECLARE_string(moe_grouped_mlp);
DECLARE_string(fp8_recipe);
DECLARE_string(fp8_format);
DECLARE_int64(pipeline_parallel);
DECLARE_int64(micro_batch_size);
DECLARE_int64(global_batch_size);
DECLARE_string(data_format);
DECLARE_int64(seed);
DECLARE_string(device);
DECLARE_int64(log_interval);
DECLARE_int64(eval_interval);
DECLARE_int64(save_interval);
DECLARE_string(save);
DECLARE_string(load);
DECLARE_bool(finetune);
DECLARE_int64(exit_interval);
DECLARE_double(exit_duration_in_mins);
DECLARE_double(distributed_timeout_minutes);
DECLARE_string(dump_reference_case);
DECLARE_string(metrics_file);
// How --metrics_file begins: every line is a JSON object (RunLog, run_log.h).
inline constexpr std::string_view kMetricsFileStart = "{";
DECLARE_double(peak_flops);
DECLARE_string(trace_file);
DECLARE_string(trace_steps);

namespace moe {

struct RunConfig {
  GptConfig model;
  TrainerOptions trainer;
  DataOptions data;
  Device device;
  int pipeline_parallel = 1;
  int data_parallel = 1;                      // world size / pipeline_parallel
  int expert_parallel = 1;                    // --expert_model_parallel_size: divides data_parallel
  std::optional<MemoryBudget> memory_budget;  // --memory_budget_gib; planned in memory_check.h
  // --trace_steps: the traced steps [first, last] (1-based); empty (last < first) without
  // --trace_file.
  std::pair<int64_t, int64_t> trace_steps{0, -1};
  // The step directory that --load resolves to (resume_check.h); "" to train from step 0.
  std::string resume_dir;
  // --finetune: only resume_dir's weights are loaded (Trainer::LoadWeights).
  bool finetune = false;
  // What the validation adjusted, one log line each (e.g. the clamped warmup).
  std::vector<std::string> notes;

  // The ranks the optimizer state is sharded over: the data-parallel ranks under
  // --use_distributed_optimizer, else 1.
  int64_t state_shards() const { return trainer.use_distributed_optimizer ? data_parallel : 1; }
};

// The trace file of `rank`: --trace_file itself in a one-rank run, else with ".rank<r>" before
// its extension (trace.json -> trace.rank1.json).
std::string TraceFilePath(int rank, int world_size);

// The data-parallel size, world_size / --pipeline_parallel (at least 1, also before
// ValidateFlags has refused a --pipeline_parallel that does not divide the world).
int64_t DataParallelSize(int world_size);

StatusOr<RunConfig> ValidateFlags(int world_size, bool dry_run = false);

}  // namespace moe
