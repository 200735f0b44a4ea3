#include "apps/moe_train/flag_rules.h"

#include <gflags/gflags.h>

#include <cstdint>

#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/offload_flags.h"
#include "apps/moe_train/run_flags.h"

namespace moe {
namespace {

using Context = FlagRuleContext;

bool Budget(const Context&) { return FLAGS_memory_budget_gib > 0; }
bool NoBudget(const Context& c) { return !Budget(c); }
bool Offloading(const Context& c) { return !FLAGS_offload_modules.empty() || Budget(c); }
bool Recomputing(const Context&) { return !FLAGS_recompute_modules.empty(); }
bool Pipeline(const Context&) { return FLAGS_pipeline_parallel > 1; }
bool FileData(const Context&) { return FLAGS_data_format != "synthetic"; }
bool Saving(const Context&) { return !FLAGS_save.empty(); }
bool Loading(const Context&) { return !FLAGS_load.empty(); }
bool Tracing(const Context&) { return !FLAGS_trace_file.empty(); }
bool Cuda(const Context& c) { return c.cuda; }
bool MoeLayers(const Context&) { return FLAGS_first_dense_layers < FLAGS_num_layers; }
bool DenseLayers(const Context&) { return FLAGS_first_dense_layers > 0; }
bool FusedMlp(const Context&) { return FLAGS_moe_grouped_mlp == "fused"; }
bool Fp8(const Context&) { return FLAGS_fp8_recipe != "none"; }
// More than one micro-batch a step on each replica.
bool SeveralMicroBatches(const Context& c) {
  return FLAGS_global_batch_size > FLAGS_micro_batch_size * DataParallelSize(c.world_size);
}
bool Training(const Context&) { return FLAGS_dump_reference_case.empty(); }
bool OneProcess(const Context& c) { return c.world_size == 1; }
bool SeveralRanks(const Context& c) { return c.world_size > 1; }
bool DryRun(const Context& c) { return c.dry_run; }
bool NotDryRun(const Context& c) { return !c.dry_run; }
// --device=cuda:N names a GPU, which only means something in one process.
bool DeviceIndexGiven(const Context&) { return FLAGS_device.rfind("cuda:", 0) == 0; }

constexpr const char* kMoe = "MoE layers (--first_dense_layers < --num_layers)";
constexpr const char* kDense = "dense layers (--first_dense_layers > 0)";
constexpr const char* kTrainingRun = "a training run (not --dump_reference_case)";
constexpr const char* kNotUsed = "it is unused there";

}  // namespace

const std::vector<FlagRule>& FlagRules() {
  static const std::vector<FlagRule> kRules = {
      // Offloading.
      {"offload_min_tensor_bytes", nullptr, "--offload_modules", Offloading,
       "without it nothing is offloaded"},
      {"offload_fraction", nullptr, "--offload_modules", Offloading,
       "without it nothing is offloaded"},
      {"offload_pp_delta_bytes", nullptr, "--offload_modules", Offloading,
       "without it nothing is offloaded"},
      {"offload_prefetch_layers", nullptr, "--offload_modules", Offloading,
       "without it nothing is offloaded"},
      // Recompute.
      {"recompute_num_layers", nullptr, "--recompute_modules", Recomputing,
       "without it nothing is recomputed"},
      // The memory plan decides per layer what the fraction knobs set by hand.
      {"offload_fraction", nullptr, "no --memory_budget_gib", NoBudget,
       "the memory plan decides per layer and group"},
      {"offload_pp_delta_bytes", nullptr, "no --memory_budget_gib", NoBudget,
       "the memory plan decides per pipeline rank"},
      {"recompute_num_layers", nullptr, "no --memory_budget_gib", NoBudget,
       "the memory plan decides per layer"},
      {"offload_pp_delta_bytes", nullptr, "--pipeline_parallel > 1", Pipeline,
       "it sets the bytes kept per pipeline rank"},
      // Pipeline parallelism.
      {"virtual_pipeline", nullptr, "--pipeline_parallel > 1", Pipeline,
       "chunks interleave across pipeline ranks"},
      {"first_stage_layers", nullptr, "--pipeline_parallel > 1", Pipeline,
       "one process holds every layer"},
      {"last_stage_layers", nullptr, "--pipeline_parallel > 1", Pipeline,
       "one process holds every layer"},
      {"device", DeviceIndexGiven, "one process", OneProcess,
       "under mpirun each rank takes the GPU of its local rank: use --device=cuda"},
      {"distributed_timeout_minutes", nullptr, "more than one rank (mpirun)", SeveralRanks,
       "one process waits for no peer"},
      // Data.
      {"data_path", nullptr, "--data_format=megatron|flat_u16|flat_u32", FileData,
       "the synthetic data reads no file"},
      // Checkpoints and outputs.
      {"save_interval", nullptr, "--save", Saving, "without it no checkpoint is written"},
      {"finetune", nullptr, "--load", Loading, "it starts from --load's weights"},
      {"trace_steps", nullptr, "--trace_file", Tracing, "without it nothing is traced"},
      {"peak_flops", nullptr, "a CUDA device", Cuda, "MFU is reported on CUDA only"},
      // Model: knobs of layers the model does not have.
      {"num_experts", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"moe_router_topk", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"moe_ffn_hidden_size", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"moe_aux_loss_coeff", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"moe_z_loss_coeff", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"moe_grouped_mlp", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"moe_wgrad_micro_batches", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"fp8_recipe", nullptr, kMoe, MoeLayers, "every layer is dense"},
      {"fp8_format", nullptr, "--fp8_recipe=blockwise", Fp8, "without it nothing is in FP8"},
      {"moe_wgrad_micro_batches", nullptr, "--moe_grouped_mlp=fused", FusedMlp,
       "the unfused path adds each micro-batch's weight gradients per expert"},
      {"moe_wgrad_micro_batches", nullptr,
       "several micro-batches a step (--global_batch_size > --micro_batch_size x data-parallel "
       "size)",
       SeveralMicroBatches, "with one, every backward is the step's last"},
      {"ffn_hidden_size", nullptr, kDense, DenseLayers,
       "every layer is MoE (its width is --moe_ffn_hidden_size)"},
      // A reference dump runs one forward and backward and exits: the loop's knobs are unused.
      {"train_steps", nullptr, kTrainingRun, Training, kNotUsed},
      {"global_batch_size", nullptr, kTrainingRun, Training, kNotUsed},
      {"lr", nullptr, kTrainingRun, Training, kNotUsed},
      {"min_lr", nullptr, kTrainingRun, Training, kNotUsed},
      {"warmup_steps", nullptr, kTrainingRun, Training, kNotUsed},
      {"weight_decay", nullptr, kTrainingRun, Training, kNotUsed},
      {"clip_grad", nullptr, kTrainingRun, Training, kNotUsed},
      {"adam_beta1", nullptr, kTrainingRun, Training, kNotUsed},
      {"adam_beta2", nullptr, kTrainingRun, Training, kNotUsed},
      {"adam_eps", nullptr, kTrainingRun, Training, kNotUsed},
      {"moe_wgrad_micro_batches", nullptr, kTrainingRun, Training, kNotUsed},
      {"exp_avg_dtype", nullptr, kTrainingRun, Training, kNotUsed},
      {"exp_avg_sq_dtype", nullptr, kTrainingRun, Training, kNotUsed},
      {"eval_interval", nullptr, kTrainingRun, Training, kNotUsed},
      {"eval_steps", nullptr, kTrainingRun, Training, kNotUsed},
      {"save", nullptr, kTrainingRun, Training, kNotUsed},
      {"metrics_file", nullptr, kTrainingRun, Training, kNotUsed},
      {"log_interval", nullptr, kTrainingRun, Training, kNotUsed},
      {"trace_file", nullptr, kTrainingRun, Training, kNotUsed},
      {"offload_modules", nullptr, kTrainingRun, Training, kNotUsed},
      {"memory_budget_gib", nullptr, kTrainingRun, Training, kNotUsed},
      {"exit_interval", nullptr, kTrainingRun, Training, kNotUsed},
      {"exit_duration_in_mins", nullptr, kTrainingRun, Training, kNotUsed},
      // A dry run (dry_run.h) plans a run on other machines; its knobs mean nothing to a run.
      {"dry_run_world_size", nullptr, "--dry_run", DryRun,
       "a run's world size is the number of processes mpirun starts"},
      {"dry_run_device_memory_gib", nullptr, "--dry_run", DryRun,
       "a run checks the memory of the device it has"},
      {"dry_run_json", nullptr, "--dry_run", DryRun, "without it there is no dry-run report"},
      {"dump_reference_case", nullptr, "no --dry_run", NotDryRun, "a dry run computes nothing"},
  };
  return kRules;
}

Status CheckFlagRules(const FlagRuleContext& context) {
  for (const FlagRule& rule : FlagRules()) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(rule.flag, &info)) continue;  // not linked in
    const bool in_use = rule.in_use != nullptr ? rule.in_use(context) : !info.is_default;
    if (!in_use || rule.feature_on(context)) continue;
    return InvalidArgument("--" + std::string(rule.flag) + "=" + FlagValueText(rule.flag) +
                           " needs " + rule.needs + ": " + rule.why);
  }
  return Status::Ok();
}

}  // namespace moe
