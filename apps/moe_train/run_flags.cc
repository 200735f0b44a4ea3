#include "apps/moe_train/run_flags.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <set>

#include "apps/common/output_checks.h"
#include "apps/moe_train/flag_rules.h"
#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/offload_flags.h"
#include "apps/moe_train/resume_check.h"
#include "engine/io/chrome_trace.h"
#include "engine/runtime/device_context.h"

// Model shape.
DEFINE_int64(num_layers, 2, "transformer layers");
DEFINE_int64(hidden_size, 128, "model width");
DEFINE_int64(num_attention_heads, 2, "query heads");
DEFINE_int64(num_query_groups, 1, "key/value heads (grouped-query attention)");
DEFINE_int64(kv_channels, 0, "attention head dimension (0: --hidden_size / --num_attention_heads)");
DEFINE_bool(qk_layernorm, false,
            "RMSNorm of queries and keys before RoPE, one head_dim weight shared by the heads "
            "(Qwen3)");
DEFINE_bool(qk_layernorm_across_heads, false,
            "with --qk_layernorm: one norm over all query heads and one over all key heads of a "
            "token (OLMoE)");
DEFINE_double(rotary_base, 10000, "RoPE base (Hugging Face rope_theta)");
DEFINE_double(norm_epsilon, 1e-5, "epsilon of every RMSNorm");
DEFINE_int64(ffn_hidden_size, 256, "dense MLP width");
DEFINE_int64(num_experts, 4, "experts per MoE layer");
DEFINE_int64(moe_router_topk, 2, "experts per token");
DEFINE_int64(moe_ffn_hidden_size, 128, "expert MLP width");
DEFINE_double(moe_aux_loss_coeff, 1e-2, "load-balancing loss coefficient");
DEFINE_double(moe_z_loss_coeff, 0.0, "router z-loss coefficient (0: off)");
DEFINE_bool(moe_router_pre_softmax, false,
            "gate weights = the top-k experts' softmax probabilities over all experts, not "
            "renormalised over the k (OLMoE); off: renormalised (Qwen3-MoE, Mixtral)");
DEFINE_string(moe_grouped_mlp, "fused",
              "the experts' grouped MLP: fused (grouped GEMMs over all experts) | unfused "
              "(per-expert GEMMs)");
DEFINE_int64(moe_wgrad_micro_batches, 1,
             "the fused expert layer adds its weight gradients once per this many micro-batches, "
             "in one pass over the gradients (holds their operands until then)");
DEFINE_string(fp8_recipe, "none",
              "the expert GEMMs' precision: none (bf16) | blockwise (DeepSeek-V3's FP8: e4m3 in 1 "
              "x 128 activation tiles and 128 x 128 weight blocks, f32 scales; fused grouped MLP)");
DEFINE_string(fp8_format, "e4m3", "the FP8 format of --fp8_recipe: e4m3 (the only one)");
DEFINE_int64(first_dense_layers, 1, "leading layers with a dense MLP; the rest are MoE");
DEFINE_int64(seq_length, 64, "tokens per sequence");
DEFINE_int64(vocab_size, 256, "vocabulary size");
// Training.
DEFINE_int64(micro_batch_size, 8, "sequences per forward/backward");
DEFINE_int64(global_batch_size, 16, "sequences per optimizer step (micro x accumulation)");
DEFINE_int64(train_steps, 300, "optimizer steps");
DEFINE_double(lr, 3e-3, "peak learning rate");
DEFINE_double(min_lr, 3e-4, "final learning rate of the cosine decay");
DEFINE_int64(warmup_steps, 20, "linear warmup steps");
DEFINE_double(weight_decay, 0.1, "AdamW decoupled weight decay (not on norms)");
DEFINE_double(clip_grad, 1.0, "global gradient-norm clip");
DEFINE_double(adam_beta1, 0.9, "AdamW decay rate of the first moment");
DEFINE_double(adam_beta2, 0.95, "AdamW decay rate of the second moment");
DEFINE_double(adam_eps, 1e-8, "AdamW epsilon, added to the second moment's square root");
DEFINE_int64(seed, 1234, "seed of the initial weights and the data order");
DEFINE_string(exp_avg_dtype, "fp32",
              "storage of AdamW's first moment: fp32 | bf16 (Megatron-LM's option; the update's "
              "arithmetic stays f32)");
DEFINE_string(exp_avg_sq_dtype, "fp32", "storage of AdamW's second moment: fp32 | bf16");
DEFINE_string(main_grads_dtype, "fp32",
              "storage of the gradients accumulated over micro-batches and reduced over data "
              "ranks: fp32 | bf16 (Megatron-LM's option; each add is f32, rounded to bf16)");
// Parallelism (the process count comes from mpirun; data-parallel size = ranks / pipeline).
DEFINE_int64(pipeline_parallel, 1, "pipeline stages (ranks per model replica)");
DEFINE_int64(virtual_pipeline, 1, "model chunks per pipeline rank (interleaved 1F1B when > 1)");
DEFINE_int64(
    expert_model_parallel_size, 1,
    "expert parallelism: the experts of each MoE layer split over groups of this many "
    "consecutive data-parallel ranks, tokens exchanged by all-to-all (Megatron-LM's name)");
DEFINE_int64(first_stage_layers, -1, "layers of the first pipeline stage");
DEFINE_int64(last_stage_layers, -1, "layers of the last pipeline stage");
DEFINE_double(distributed_timeout_minutes, 10,
              "a collective or transfer that has not finished after this long ends the job: one "
              "line naming it, the ranks that did not arrive and the step, exit code 1 "
              "(Megatron-LM's option)");
DEFINE_bool(use_distributed_optimizer, false,
            "shard the f32 master weights and AdamW moments over the data-parallel ranks "
            "(reduce-scatter gradients, all-gather weights; Megatron-LM's option)");
// Data.
DEFINE_string(data_format, "synthetic", "synthetic | megatron | flat_u16 | flat_u32");
DEFINE_string(data_path, "", "megatron: path prefix of .bin/.idx; flat: the token file");
// Evaluation, checkpoints, output.
DEFINE_int64(eval_interval, 100, "evaluate every N steps");
DEFINE_int64(eval_steps, 8, "validation batches per evaluation");
DEFINE_string(save, "",
              "checkpoint root directory (empty: no checkpoints), locked by the run; on SIGTERM, "
              "SIGINT or SIGUSR1 the run saves the step it finishes and exits with code 75");
DEFINE_int64(save_interval, 0, "checkpoint every N steps");
DEFINE_string(load, "",
              "resume from a checkpoint root (its newest complete step directory) or a step "
              "directory; naming --save while it holds no checkpoint yet starts from step 0");
DEFINE_bool(finetune, false,
            "start from --load's model weights alone (Megatron-LM's option): step 0, a fresh "
            "optimizer, the data from the start; the checkpoint's parameter shapes must be this "
            "model's (--seq_length, --rotary_base, ... may differ); e.g. an hf_convert import");
DEFINE_int64(exit_interval, 0,
             "stop after a step that is a multiple of N, saving it when --save is set; exit code "
             "75 (Megatron-LM's option)");
DEFINE_double(exit_duration_in_mins, 0,
              "stop before the run, counted from its start, would pass this many minutes (when "
              "the next step would end after it), saving when --save is set; exit code 75 "
              "(Megatron-LM's option)");
DEFINE_string(dump_reference_case, "",
              "write one micro-batch's weights, loss and gradients to this directory and exit "
              "(for tests/reference/torch_reference.py)");
DEFINE_string(metrics_file, "", "append one JSON object per log line to this file");
DEFINE_int64(log_interval, 10, "log every N steps");
DEFINE_string(device, "auto", "cpu | cuda | cuda:N | auto (cuda when a GPU is present)");
DEFINE_double(peak_flops, 989e12, "peak FLOP/s of one device, for MFU");
DEFINE_string(trace_file, "",
              "write a Chrome trace (Perfetto, chrome://tracing) of --trace_steps here; under "
              "mpirun one file per rank, <stem>.rank<r><ext>");
DEFINE_string(trace_steps, "2:2", "A:B: the steps (1-based, inclusive) that --trace_file records");

namespace moe {
namespace {

StatusOr<GroupedMlpKind> ParseGroupedMlp(const std::string& text) {
  if (text == "fused") return GroupedMlpKind::kFused;
  if (text == "unfused") return GroupedMlpKind::kUnfused;
  return InvalidArgument("--moe_grouped_mlp=" + text + " must be fused or unfused");
}

StatusOr<Fp8Recipe> ParseFp8Recipe(const std::string& recipe, const std::string& format) {
  if (format != "e4m3") return InvalidArgument("--fp8_format=" + format + " must be e4m3");
  if (recipe == "none") return Fp8Recipe::kNone;
  if (recipe == "blockwise") return Fp8Recipe::kBlockwise;
  return InvalidArgument("--fp8_recipe=" + recipe + " must be none or blockwise");
}

StatusOr<DType> ParseOptimizerDType(const char* flag, const std::string& text) {
  if (const std::optional<DType> dtype = OptimizerDTypeFromName(text)) return *dtype;
  return InvalidArgument(std::string("--") + flag + "=" + text + " must be " +
                         kOptimizerDTypeNames);
}

// `dry_run`: --device=auto is the target machine's GPU (dry_run.h), wherever this process runs.
StatusOr<Device> ParseDevice(const std::string& text, bool dry_run) {
  if (text == "cpu") return Device::CPU();
  if (text == "auto") return dry_run || CudaDeviceCount() > 0 ? Device::CUDA(0) : Device::CPU();
  if (text == "cuda") return Device::CUDA(0);
  int index = 0;
  const char* digits = text.data() + std::min<size_t>(text.size(), 5);
  const char* end = text.data() + text.size();
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
      std::isdigit(static_cast<unsigned char>(*digits))) {  // no sign
    // from_chars refuses what an int cannot hold (cuda:99999999999), which std::stoi threw for.
    const auto [at, error] = std::from_chars(digits, end, index);
    if (error == std::errc() && at == end) return Device::CUDA(index);
  }
  return InvalidArgument("--device=" + text + " must be cpu, cuda, cuda:N or auto");
}

// The relations between training flags. A reference dump refuses the loop's flags as unused
// (flag_rules.h), so their defaults are not checked against anything either: it runs one
// micro-batch, its global batch.
Status CheckTraining(TrainerOptions& t) {
  if (!FLAGS_dump_reference_case.empty()) {
    t.global_batch_size = t.micro_batch_size;
    return Status::Ok();
  }
  if (t.global_batch_size % t.micro_batch_size != 0) {
    return InvalidArgument(
        "--global_batch_size=" + std::to_string(t.global_batch_size) +
        " is not a multiple of --micro_batch_size=" + std::to_string(t.micro_batch_size));
  }
  if (FLAGS_min_lr > FLAGS_lr) {
    return InvalidArgument("--min_lr=" + FlagValueText("min_lr") +
                           " must be in [0, --lr=" + FlagValueText("lr") + "]");
  }
  return Status::Ok();
}

// --trace_steps=A:B within [1, --train_steps]; only with --trace_file (else unused: the rules).
StatusOr<std::pair<int64_t, int64_t>> ParseTraceSteps(int64_t train_steps) {
  const std::string& text = FLAGS_trace_steps;
  if (FLAGS_trace_file.empty()) return std::pair<int64_t, int64_t>{0, -1};  // flag_rules.cc
  const std::string bad = "--trace_steps=" + text;
  const size_t colon = text.find(':');
  const auto number = [](const std::string& part) -> int64_t {
    if (part.empty() || part.size() > 18 ||
        part.find_first_not_of("0123456789") != std::string::npos) {
      return -1;
    }
    return std::stoll(part);
  };
  if (colon == std::string::npos) return InvalidArgument(bad + " must be A:B (two step numbers)");
  const int64_t first = number(text.substr(0, colon));
  const int64_t last = number(text.substr(colon + 1));
  if (first < 1 || last < first) {
    return InvalidArgument(bad + " must be A:B with 1 <= A <= B");
  }
  if (last > train_steps) {
    return InvalidArgument(bad + " ends after --train_steps=" + std::to_string(train_steps));
  }
  return std::pair<int64_t, int64_t>{first, last};
}

Status CheckParallel(int world_size) {
  if (world_size % FLAGS_pipeline_parallel != 0) {
    return InvalidArgument("--pipeline_parallel=" + std::to_string(FLAGS_pipeline_parallel) +
                           " does not divide " + std::to_string(world_size) + " ranks");
  }
  const int64_t data_size = world_size / FLAGS_pipeline_parallel;
  if (data_size % FLAGS_expert_model_parallel_size != 0) {
    return InvalidArgument(
        "--expert_model_parallel_size=" + std::to_string(FLAGS_expert_model_parallel_size) +
        " does not divide the data-parallel size " + std::to_string(data_size) + " (" +
        std::to_string(world_size) +
        " ranks / --pipeline_parallel=" + std::to_string(FLAGS_pipeline_parallel) + ")");
  }
  if (world_size > 1 && !FLAGS_dump_reference_case.empty()) {
    return InvalidArgument("--dump_reference_case runs in one process (without mpirun)");
  }
  return Status::Ok();
}

}  // namespace

int64_t DataParallelSize(int world_size) {
  return std::max<int64_t>(1, world_size / std::max<int64_t>(1, FLAGS_pipeline_parallel));
}

std::string TraceFilePath(int rank, int world_size) {
  if (world_size == 1) return FLAGS_trace_file;
  const std::filesystem::path path(FLAGS_trace_file);
  std::filesystem::path out = path.parent_path() / path.stem();
  return out.string() + ".rank" + std::to_string(rank) + path.extension().string();
}

namespace {

// --dump_reference_case replaces its two files in the directory: an existing one must hold
// nothing else (new, empty, or an earlier dump), so no other file there is replaced by mistake.
Status CheckReferenceCaseDirectory(const std::string& dir) {
  std::error_code error;
  if (dir.empty() || !std::filesystem::is_directory(dir, error)) return Status::Ok();
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name != kReferenceCaseTensors && name != kReferenceCaseConfig) {
      return InvalidArgument("--dump_reference_case " + dir + " holds other files ('" + name +
                             "'): it takes a new or empty directory, or an earlier dump's");
    }
  }
  return Status::Ok();
}

// moe_train's outputs (apps/common/output_checks.h), and no two of them naming the same path.
Status CheckOutputFlags(int world_size) {
  MOE_RETURN_IF_ERROR(
      CheckOwnOutputFile("metrics_file", FLAGS_metrics_file, kMetricsFileStart, "append to"));
  for (int rank = 0; rank < world_size && !FLAGS_trace_file.empty(); ++rank) {
    MOE_RETURN_IF_ERROR(CheckOwnOutputFile("trace_file", TraceFilePath(rank, world_size),
                                           kChromeTraceStart, "replace"));
  }
  MOE_RETURN_IF_ERROR(CheckOutputDirectory("save", FLAGS_save));
  MOE_RETURN_IF_ERROR(CheckSaveRoot(FLAGS_save, FLAGS_load));
  MOE_RETURN_IF_ERROR(CheckOutputDirectory("dump_reference_case", FLAGS_dump_reference_case));
  MOE_RETURN_IF_ERROR(CheckReferenceCaseDirectory(FLAGS_dump_reference_case));
  const std::vector<std::pair<const char*, std::string>> outputs = {
      {"metrics_file", FLAGS_metrics_file},
      {"trace_file", FLAGS_trace_file},
      {"save", FLAGS_save},
      {"dump_reference_case", FLAGS_dump_reference_case},
      {"load", FLAGS_load}};
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (outputs[i].second.empty() || outputs[j].second.empty()) continue;
      const bool load_pair = std::string(outputs[j].first) == "load";
      if (load_pair && std::string(outputs[i].first) == "save") continue;  // resuming in place
      if (SamePath(outputs[i].second, outputs[j].second)) {
        return InvalidArgument("--" + std::string(outputs[i].first) + " and --" + outputs[j].first +
                               " name the same path " + outputs[i].second);
      }
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<RunConfig> ValidateFlags(int world_size, bool dry_run) {
  MOE_RETURN_IF_ERROR(CheckFlagRanges());
  FlagRuleContext context;
  context.world_size = world_size;
  context.dry_run = dry_run;
  context.cuda = FLAGS_device.rfind("cuda", 0) == 0 ||
                 (FLAGS_device == "auto" && (dry_run || CudaDeviceCount() > 0));
  MOE_RETURN_IF_ERROR(CheckFlagRules(context));
  RunConfig run;
  GptConfig& m = run.model;
  m.num_layers = FLAGS_num_layers;
  m.hidden_size = FLAGS_hidden_size;
  m.num_attention_heads = FLAGS_num_attention_heads;
  m.num_query_groups = FLAGS_num_query_groups;
  m.kv_channels = FLAGS_kv_channels;
  m.qk_layernorm = FLAGS_qk_layernorm;
  m.qk_layernorm_across_heads = FLAGS_qk_layernorm_across_heads;
  m.rotary_base = static_cast<float>(FLAGS_rotary_base);
  m.norm_epsilon = static_cast<float>(FLAGS_norm_epsilon);
  m.ffn_hidden_size = FLAGS_ffn_hidden_size;
  m.num_experts = FLAGS_num_experts;
  m.moe_router_topk = FLAGS_moe_router_topk;
  m.moe_ffn_hidden_size = FLAGS_moe_ffn_hidden_size;
  m.moe_aux_loss_coeff = static_cast<float>(FLAGS_moe_aux_loss_coeff);
  m.moe_z_loss_coeff = static_cast<float>(FLAGS_moe_z_loss_coeff);
  m.moe_router_pre_softmax = FLAGS_moe_router_pre_softmax;
  MOE_ASSIGN_OR_RETURN(m.moe_grouped_mlp, ParseGroupedMlp(FLAGS_moe_grouped_mlp));
  m.moe_wgrad_micro_batches = FLAGS_moe_wgrad_micro_batches;
  MOE_ASSIGN_OR_RETURN(m.fp8_recipe, ParseFp8Recipe(FLAGS_fp8_recipe, FLAGS_fp8_format));
  m.first_dense_layers = FLAGS_first_dense_layers;
  m.seq_length = FLAGS_seq_length;
  m.vocab_size = FLAGS_vocab_size;
  MOE_RETURN_IF_ERROR(CheckModel(m));

  TrainerOptions& t = run.trainer;
  t.micro_batch_size = FLAGS_micro_batch_size;
  t.global_batch_size = FLAGS_global_batch_size;
  t.train_steps = FLAGS_train_steps;
  t.lr = static_cast<float>(FLAGS_lr);
  t.min_lr = static_cast<float>(FLAGS_min_lr);
  t.warmup_steps = FLAGS_warmup_steps;
  t.adamw.weight_decay = static_cast<float>(FLAGS_weight_decay);
  t.adamw.clip_grad = static_cast<float>(FLAGS_clip_grad);
  t.adamw.beta1 = static_cast<float>(FLAGS_adam_beta1);
  t.adamw.beta2 = static_cast<float>(FLAGS_adam_beta2);
  t.adamw.eps = static_cast<float>(FLAGS_adam_eps);
  t.eval_steps = FLAGS_eval_steps;
  t.seed = static_cast<uint64_t>(FLAGS_seed);
  MOE_ASSIGN_OR_RETURN(t.optimizer_dtypes.grad,
                       ParseOptimizerDType("main_grads_dtype", FLAGS_main_grads_dtype));
  MOE_ASSIGN_OR_RETURN(t.optimizer_dtypes.exp_avg,
                       ParseOptimizerDType("exp_avg_dtype", FLAGS_exp_avg_dtype));
  MOE_ASSIGN_OR_RETURN(t.optimizer_dtypes.exp_avg_sq,
                       ParseOptimizerDType("exp_avg_sq_dtype", FLAGS_exp_avg_sq_dtype));
  MOE_RETURN_IF_ERROR(CheckTraining(t));
  if (t.warmup_steps > t.train_steps) {
    run.notes.push_back("schedule: --warmup_steps=" + std::to_string(t.warmup_steps) +
                        " is longer than the run (--train_steps=" + std::to_string(t.train_steps) +
                        "): warmup clamped to " + std::to_string(t.train_steps) + " steps");
    t.warmup_steps = t.train_steps;
  }
  if (!dry_run) MOE_RETURN_IF_ERROR(CheckOutputFlags(world_size));
  MOE_ASSIGN_OR_RETURN(run.trace_steps, ParseTraceSteps(t.train_steps));
  MOE_RETURN_IF_ERROR(CheckParallel(world_size));
  run.pipeline_parallel = static_cast<int>(FLAGS_pipeline_parallel);
  run.data_parallel = static_cast<int>(DataParallelSize(world_size));
  run.expert_parallel = static_cast<int>(FLAGS_expert_model_parallel_size);
  MOE_RETURN_IF_ERROR(CheckExpertParallel(m, run.expert_parallel));
  t.virtual_pipeline = static_cast<int>(FLAGS_virtual_pipeline);
  t.first_stage_layers = static_cast<int>(FLAGS_first_stage_layers);
  t.last_stage_layers = static_cast<int>(FLAGS_last_stage_layers);
  t.use_distributed_optimizer = FLAGS_use_distributed_optimizer;
  if (t.use_distributed_optimizer && run.data_parallel == 1) {
    run.notes.push_back(
        "optimizer: --use_distributed_optimizer with one data-parallel rank: its one shard is the "
        "whole state (as without the flag)");
  }

  static const std::set<std::string> kFormats = {"synthetic", "megatron", "flat_u16", "flat_u32"};
  if (!kFormats.count(FLAGS_data_format)) {
    return InvalidArgument("--data_format=" + FLAGS_data_format +
                           " must be synthetic, megatron, flat_u16 or flat_u32");
  }
  if (FLAGS_data_format != "synthetic" && FLAGS_data_path.empty()) {
    return InvalidArgument("--data_format=" + FLAGS_data_format + " needs --data_path");
  }
  run.data.format = FLAGS_data_format;
  run.data.path = FLAGS_data_path;
  run.data.vocab_size = m.vocab_size;
  run.data.synthetic.seed = t.seed;

  MOE_ASSIGN_OR_RETURN(run.device, ParseDevice(FLAGS_device, dry_run));
  const Status available = dry_run ? Status::Ok() : CheckDeviceAvailable(run.device);
  if (!available.ok())
    return InvalidArgument("--device=" + FLAGS_device + ": " + available.message());
  if (run.device.is_cuda() && m.head_dim() != 64 && m.head_dim() != 128) {
    return InvalidArgument(
        "--hidden_size / --num_attention_heads = " + std::to_string(m.head_dim()) +
        ": the CUDA attention kernels take head dims 64 and 128");
  }
  MOE_ASSIGN_OR_RETURN(run.memory_budget, MemoryBudgetFromFlags(m));
  MOE_ASSIGN_OR_RETURN(run.trainer.offload, OffloadOptionsFromFlags(m, run.memory_budget));
  if (!run.memory_budget) {  // else the plan sets what each layer recomputes (memory_check.h)
    MOE_ASSIGN_OR_RETURN(m.recompute, RecomputeFromFlags(run.trainer.offload));
    MOE_ASSIGN_OR_RETURN(m.recompute_num_layers, RecomputeNumLayersFromFlags(m));
  }
  if (!dry_run) MOE_RETURN_IF_ERROR(CheckResume(&run));
  return run;
}

}  // namespace moe
