#include "apps/moe_train/flag_table.h"

#include <gflags/gflags.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

namespace moe {
namespace {

constexpr double kMaxInt64 = 9223372036854775807.0;
constexpr double k2e20 = 1 << 20;  // 1048576
constexpr double k2e40 = 1099511627776.0;

FlagRow Text(const char* name, const char* group) { return {name, group}; }
FlagRow Range(const char* name, const char* group, double min, double max,
              const char* relation = "") {
  return {name, group, true, min, max, false, false, relation};
}
FlagRow Positive(const char* name, const char* group, double max, const char* relation = "") {
  return {name, group, true, 0, max, true, false, relation};
}
// [0, 1): an exponential decay rate.
FlagRow DecayRate(const char* name, const char* group) {
  return {name, group, true, 0, 1, false, true, ""};
}

std::string IntegerText(double value) {
  if (value == kMaxInt64) return "9223372036854775807";
  char buffer[32];
  snprintf(buffer, sizeof(buffer), "%.0f", value);
  return buffer;
}

bool IsInteger(const std::string& type) { return type != "double"; }

std::string RangeText(const FlagRow& row, const std::string& type) {
  const auto bound = [&](double v) { return IsInteger(type) ? IntegerText(v) : ShortestDouble(v); };
  std::string out = row.min_open ? "(" : "[";
  out += bound(row.min);
  out += ", ";
  out += bound(row.max);
  out += row.max_open ? ")" : "]";
  if (*row.relation) {
    out += ", ";
    out += row.relation;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& FlagGroups() {
  static const std::vector<std::string> kGroups = {
      "model",         "expert layer",  "training",   "parallelism", "data",   "eval, checkpoints",
      "seeing a step", "memory budget", "offloading", "recompute",   "dry run"};
  return kGroups;
}

const std::vector<FlagRow>& FlagTable() {
  static const std::vector<FlagRow> kRows = {
      Range("num_layers", "model", 1, k2e20),
      Range("hidden_size", "model", 1, k2e20,
            "a multiple of --num_attention_heads unless --kv_channels is set"),
      Range("num_attention_heads", "model", 1, 1 << 16),
      Range("num_query_groups", "model", 1, 1 << 16, "divides --num_attention_heads"),
      Range("kv_channels", "model", 0, 1 << 16, "0: --hidden_size / --num_attention_heads; even"),
      Text("qk_layernorm", "model"),
      Text("qk_layernorm_across_heads", "model"),
      Positive("rotary_base", "model", 1e12),
      Positive("norm_epsilon", "model", 1),
      Range("ffn_hidden_size", "model", 1, 1 << 24),
      Range("num_experts", "model", 1, 1 << 16),
      Range("moe_router_topk", "model", 1, 1 << 16, "<= --num_experts"),
      Range("moe_ffn_hidden_size", "model", 1, 1 << 24),
      Range("moe_aux_loss_coeff", "model", 0, 100),
      Range("moe_z_loss_coeff", "model", 0, 100),
      Text("moe_router_pre_softmax", "model"),
      Range("first_dense_layers", "model", 0, k2e20, "<= --num_layers"),
      Range("seq_length", "model", 1, 1 << 24),
      Range("vocab_size", "model", 2, 2147483647.0),  // OpenTokenSource's bounds
      Text("moe_grouped_mlp", "expert layer"),
      Range("moe_wgrad_micro_batches", "expert layer", 1, 1024),
      Text("fp8_recipe", "expert layer"),
      Text("fp8_format", "expert layer"),
      Range("micro_batch_size", "training", 1, k2e20),
      Range("global_batch_size", "training", 1, 1 << 30,
            "a multiple of --micro_batch_size x data-parallel size"),
      Range("train_steps", "training", 1, k2e40),
      Range("lr", "training", 1e-10, 10),
      Range("min_lr", "training", 0, 10, "<= --lr"),
      Range("warmup_steps", "training", 0, k2e40, "longer than --train_steps: clamped to it"),
      Range("weight_decay", "training", 0, 10),
      Range("clip_grad", "training", 0, 1e6, "0: off"),
      DecayRate("adam_beta1", "training"),
      DecayRate("adam_beta2", "training"),
      Positive("adam_eps", "training", 1),
      Range("seed", "training", 0, kMaxInt64),
      Text("exp_avg_dtype", "training"),
      Text("exp_avg_sq_dtype", "training"),
      Text("main_grads_dtype", "training"),
      Text("device", "training"),
      Range("pipeline_parallel", "parallelism", 1, 4096, "divides the number of ranks"),
      Range("virtual_pipeline", "parallelism", 1, 1024),
      Range("expert_model_parallel_size", "parallelism", 1, 4096,
            "divides the data-parallel size and --num_experts"),
      Range("first_stage_layers", "parallelism", -1, k2e20, "-1: even split"),
      Range("last_stage_layers", "parallelism", -1, k2e20, "-1: even split"),
      Text("use_distributed_optimizer", "parallelism"),
      Positive("distributed_timeout_minutes", "parallelism", 1e4),
      Text("data_format", "data"),
      Text("data_path", "data"),
      Range("eval_interval", "eval, checkpoints", 0, k2e40, "0: only at the end"),
      Range("eval_steps", "eval, checkpoints", 1, k2e20),
      Text("save", "eval, checkpoints"),
      Range("save_interval", "eval, checkpoints", 0, k2e40, "0: only at the end"),
      Text("load", "eval, checkpoints"),
      Text("finetune", "eval, checkpoints"),
      Range("exit_interval", "eval, checkpoints", 0, k2e40, "0: off"),
      Range("exit_duration_in_mins", "eval, checkpoints", 0, 1e6, "0: off"),
      Text("metrics_file", "eval, checkpoints"),
      Range("log_interval", "eval, checkpoints", 1, k2e40),
      Text("dump_reference_case", "eval, checkpoints"),
      Text("trace_file", "seeing a step"),
      Text("trace_steps", "seeing a step"),
      Positive("peak_flops", "seeing a step", 1e18),
      Range("memory_budget_gib", "memory budget", 0, 1048576, "0: off"),
      Text("offload_modules", "offloading"),
      Range("offload_min_tensor_bytes", "offloading", 0, 1125899906842624.0),
      Range("offload_fraction", "offloading", 0, 1),
      Range("offload_pp_delta_bytes", "offloading", 0, 1125899906842624.0),
      Range("offload_prefetch_layers", "offloading", 0, k2e20, "<= --num_layers"),
      Text("recompute_modules", "recompute"),
      Range("recompute_num_layers", "recompute", -1, k2e20,
            "-1: every layer; else 1 to --num_layers"),
      Text("dry_run", "dry run"),
      Range("dry_run_world_size", "dry run", 1, 1 << 20, "a multiple of --pipeline_parallel"),
      Positive("dry_run_device_memory_gib", "dry run", 1048576),
      Text("dry_run_json", "dry run"),
  };
  return kRows;
}

std::string ShortestDouble(double value) {
  // The fewest significant digits that parse back to `value`, in printf's %g form (0.0003, not
  // 3e-04 as std::to_chars would have it).
  char buffer[64];
  if (value == std::floor(value) && std::fabs(value) < 1e7) {  // 10, not 1e+01
    snprintf(buffer, sizeof(buffer), "%.0f", value);
    return buffer;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    snprintf(buffer, sizeof(buffer), "%.*g", digits, value);
    if (std::strtod(buffer, nullptr) == value || std::isnan(value)) break;
  }
  return buffer;
}

std::string FlagValueText(const std::string& name) {
  const gflags::CommandLineFlagInfo info = gflags::GetCommandLineFlagInfoOrDie(name.c_str());
  if (info.type != "double") return info.current_value;
  return ShortestDouble(std::strtod(info.current_value.c_str(), nullptr));
}

Status CheckFlagRanges() {
  for (const FlagRow& row : FlagTable()) {
    if (!row.is_numeric) continue;
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(row.name, &info)) continue;  // not linked in
    const double value = std::strtod(info.current_value.c_str(), nullptr);
    const bool above_min = row.min_open ? value > row.min : value >= row.min;
    const bool below_max = row.max_open ? value < row.max : value <= row.max;
    if (!(above_min && below_max)) {  // NaN fails both
      std::string range = RangeText(row, info.type);
      if (*row.relation) range = range.substr(0, range.find_first_of("])") + 1);
      return InvalidArgument("--" + std::string(row.name) + "=" + FlagValueText(row.name) +
                             " must be in " + range);
    }
  }
  return Status::Ok();
}

std::string FlagHelp(const std::string& program, bool short_form) {
  std::map<std::string, const FlagRow*> rows;
  for (const FlagRow& row : FlagTable()) rows[row.name] = &row;
  // The project's flags are those defined under apps/moe_train; any not in the table is listed
  // under "other" so that a new flag is never hidden.
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::map<std::string, const gflags::CommandLineFlagInfo*> infos;
  std::vector<std::string> others;
  for (const auto& flag : flags) {
    if (flag.filename.find("apps/moe_train") == std::string::npos) continue;
    infos[flag.name] = &flag;
    if (!rows.count(flag.name)) others.push_back(flag.name);
  }
  std::ostringstream out;
  out << program << ": trains a Mixture-of-Experts GPT (README.md).\n"
      << "usage: " << program << " [--flagfile=FILE] [--name=value ...]   "
      << "(under mpirun: mpirun -np N " << program << " ...)\n"
      << "Every flag is checked before any work; a problem is one line and exit code 2.\n"
      << "--dry_run: what the run needs per rank of --dry_run_world_size ranks, and whether it "
         "fits, without running it.\n";
  auto print = [&](const std::string& name, const FlagRow* row) {
    const auto* info = infos.at(name);
    if (short_form) {
      out << " --" << name;
      return;
    }
    out << "  --" << name << "=" << FlagValueText(name) << "\n      " << info->description;
    if (row != nullptr && row->is_numeric) out << "; in " << RangeText(*row, info->type);
    if (row == nullptr && info->type != "string" && info->type != "bool") {
      out << "; no range documented";
    }
    out << "\n";
  };
  for (const std::string& group : FlagGroups()) {
    out << "\n" << group << ":" << (short_form ? "" : "\n");
    for (const FlagRow& row : FlagTable()) {
      if (row.group == group && infos.count(row.name)) print(row.name, &row);
    }
  }
  if (!others.empty()) {
    out << "\nother:" << (short_form ? "" : "\n");
    for (const std::string& name : others) print(name, nullptr);
  }
  out << (short_form ? "\n" : "") << "\n"
      << (short_form ? "--help: these flags with defaults, ranges and descriptions; " : "")
      << "--helpfull: also the flags of glog and gflags (logging, flag handling).\n";
  return out.str();
}

}  // namespace moe
