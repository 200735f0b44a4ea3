// moe_train as a user meets it (issue 14, "careless input"): every argument, flagfile line and
// flag is used or refused; a refusal is exit code 2, nothing on stdout, exactly one line on
// stderr, and nothing created or changed; outputs are checked before the first step; a run too
// large for the machine is refused at start, and one that runs out mid-step ends in one line; a
// non-finite loss or gradient norm stops the run before anything of that step is saved; what the
// log prints can be passed back; --help shows the project's flags first. A good run logs, writes
// metrics and checkpoints, and resumes. Every test works in a temporary directory of its own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/command.h"
#include "tests/testing/safetensors_edit.h"
#include "tests/testing/source_tree.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using testing::ScopedTempDir;
using testing::SplitCommandResult;

using testing::ConfigPath;

// Runs moe_train with `dir` as its working directory, so that a file it creates by a relative
// name is seen too.
SplitCommandResult RunIn(const ScopedTempDir& dir, const std::string& args) {
  return testing::RunCommandSplit("cd " + dir.path() + " && " + MOE_TRAIN_BINARY + " " + args);
}

// `text` with every "$D" replaced by `dir`.
std::string WithDir(std::string text, const std::string& dir) {
  for (size_t at = text.find("$D"); at != std::string::npos;
       at = text.find("$D", at + dir.size())) {
    text.replace(at, 2, dir);
  }
  return text;
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A refusal: the arguments (after --device=cpu) and the one stderr line after "moe_train: ".
// "$D" in either is the test's directory; a line ending in "..." is matched as a prefix.
struct Refusal {
  std::string args;
  std::string line;
  std::function<void(const std::string& dir)> setup = nullptr;  // files the case needs
};

void PrintTo(const Refusal& refusal, std::ostream* os) { *os << refusal.args; }

void ExpectRefused(const Refusal& refusal) {
  const ScopedTempDir dir;
  if (refusal.setup) refusal.setup(dir.path());
  const std::vector<std::string> before = dir.List();
  const std::string args = WithDir(refusal.args, dir.path());
  const SplitCommandResult r = RunIn(dir, "--device=cpu " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
  EXPECT_EQ(r.out, "") << args;
  std::string expected = "moe_train: " + WithDir(refusal.line, dir.path());
  const bool prefix = expected.size() > 3 && expected.substr(expected.size() - 3) == "...";
  if (prefix) {
    expected.resize(expected.size() - 3);
    EXPECT_EQ(r.err.substr(0, expected.size()), expected) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.back(), '\n') << r.err;
  } else {
    EXPECT_EQ(r.err, expected + "\n") << args;
  }
  EXPECT_EQ(dir.List(), before) << "the refused run created or removed something: " << args;
}

class RefusalTest : public ::testing::TestWithParam<Refusal> {};
TEST_P(RefusalTest, ExitsTwoWithOneLineAndChangesNothing) { ExpectRefused(GetParam()); }

// Values and their relations.
INSTANTIATE_TEST_SUITE_P(
    Flags, RefusalTest,
    ::testing::Values(
        Refusal{"--hidden_size=66 --num_attention_heads=4",
                "--hidden_size=66 is not a multiple of --num_attention_heads=4 (or set the head "
                "dimension with --kv_channels)"},
        Refusal{"--num_attention_heads=4 --num_query_groups=3",
                "--num_attention_heads=4 is not a multiple of --num_query_groups=3"},
        Refusal{"--moe_router_topk=5", "--moe_router_topk=5 exceeds --num_experts=4"},
        Refusal{"--moe_grouped_mlp=cutlass", "--moe_grouped_mlp=cutlass must be fused or unfused"},
        Refusal{"--fp8_recipe=tensorwise", "--fp8_recipe=tensorwise must be none or blockwise"},
        Refusal{"--fp8_recipe=blockwise --fp8_format=hybrid", "--fp8_format=hybrid must be e4m3"},
        Refusal{"--fp8_format=e4m3",
                "--fp8_format=e4m3 needs --fp8_recipe=blockwise: without it nothing is in FP8"},
        Refusal{"--fp8_recipe=blockwise --moe_grouped_mlp=unfused",
                "--fp8_recipe=blockwise needs --moe_grouped_mlp=fused"},
        Refusal{"--fp8_recipe=blockwise --moe_ffn_hidden_size=40",
                "--moe_ffn_hidden_size=40 must be a multiple of 16 for --fp8_recipe=blockwise"},
        Refusal{"--exp_avg_dtype=fp16", "--exp_avg_dtype=fp16 must be fp32 or bf16"},
        Refusal{"--exp_avg_sq_dtype=bfloat16", "--exp_avg_sq_dtype=bfloat16 must be fp32 or bf16"},
        Refusal{"--main_grads_dtype=f16", "--main_grads_dtype=f16 must be fp32 or bf16"},
        Refusal{"--first_dense_layers=3", "--first_dense_layers=3 must be in [0, --num_layers=2]"},
        Refusal{"--recompute_modules=moe --recompute_num_layers=0",
                "--recompute_num_layers=0 must be -1 (every layer) or in [1, --num_layers=2]"},
        Refusal{"--global_batch_size=12",
                "--global_batch_size=12 is not a multiple of --micro_batch_size=8"},
        Refusal{"--min_lr=0.5", "--min_lr=0.5 must be in [0, --lr=0.003]"},
        Refusal{"--data_format=parquet",
                "--data_format=parquet must be synthetic, megatron, flat_u16 or flat_u32"},
        Refusal{"--data_format=megatron", "--data_format=megatron needs --data_path"},
        Refusal{"--data_format=flat_u16 --data_path=$D/none.bin",
                "--data_path $D/none.bin: no such file"},
        Refusal{"--device=tpu", "--device=tpu must be cpu, cuda, cuda:N or auto"},
        // A GPU index no int holds (was an uncaught std::out_of_range: an abort and a trace).
        Refusal{"--device=cuda:99999999999",
                "--device=cuda:99999999999 must be cpu, cuda, cuda:N or auto"},
        Refusal{"--device=cuda:-1", "--device=cuda:-1 must be cpu, cuda, cuda:N or auto"},
        // The table's bound is the data's (was "must be in [2, ...], got 1", the table said 1).
        Refusal{"--vocab_size=1", "--vocab_size=1 must be in [2, 2147483647]"},
        Refusal{"--load=$D/none", "--load $D/none: checkpoint '$D/none' does not exist"}));

// Issue 14, class 2: inputs that would be silently unused. The command line and flagfiles.
INSTANTIATE_TEST_SUITE_P(
    CommandLine, RefusalTest,
    ::testing::Values(
        Refusal{"configs/moe_100m.flags",
                "unexpected argument 'configs/moe_100m.flags' (flags are --name=value; a flagfile "
                "is --flagfile=FILE)"},
        Refusal{"--seed=1 -- more",
                "unexpected argument 'more' after -- (moe_train takes no positional arguments)"},
        Refusal{"--hiden_size=64", "unknown flag --hiden_size (did you mean --hidden_size?)"},
        Refusal{"--nohidden_size", "unknown flag --nohidden_size (did you mean --hidden_size?)"},
        Refusal{"--seed", "--seed needs a value (--seed=VALUE)"},
        Refusal{"--seed=abc", "--seed=abc is not a valid int64"},
        Refusal{"--lr=fast", "--lr=fast is not a valid double"},
        Refusal{"--fromenv=seed", "--fromenv is not supported by moe_train"},
        Refusal{"--flagfile=$D", "--flagfile=$D is a directory, not a flagfile"},
        Refusal{"--flagfile=$D/none.flags", "--flagfile=$D/none.flags: no such file"},
        Refusal{"--flagfile=$D/binary.flags",
                "--flagfile=$D/binary.flags is not a text flagfile (byte 0x00 at offset 15)",
                [](const std::string& d) {
                  WriteFile(d + "/binary.flags", std::string("--num_layers=2\n\0\x7f"
                                                             "ELF",
                                                             20));
                }},
        Refusal{"--flagfile=$D/typo.flags",
                "$D/typo.flags:3: unknown flag --hiden_size (did you mean --hidden_size?)",
                [](const std::string& d) {
                  WriteFile(d + "/typo.flags", "# a preset\n--num_layers=2\n--hiden_size=64\n");
                }},
        Refusal{"--flagfile=$D/line.flags",
                "$D/line.flags:1: 'num_layers=2' is not a flag (flagfile lines are --name=value "
                "or # comments)",
                [](const std::string& d) { WriteFile(d + "/line.flags", "num_layers=2\n"); }},
        Refusal{"--flagfile=$D/outer.flags",
                "$D/outer.flags:1: --flagfile=$D/inner.flags: no such file",
                [](const std::string& d) {
                  WriteFile(d + "/outer.flags", "--flagfile=" + d + "/inner.flags\n");
                }},
        Refusal{"--flagfile=$D/loop.flags",
                "$D/loop.flags:1: --flagfile=$D/loop.flags: flagfiles nest deeper than 16 (a "
                "cycle?)",
                [](const std::string& d) {
                  WriteFile(d + "/loop.flags", "--flagfile=" + d + "/loop.flags\n");
                }},
        // Spaces around a value: gflags took " 2" as 2 but refused "2 ", and a path with them is
        // a directory nobody meant (was created).
        Refusal{"'--num_layers= 2'", "--num_layers=' 2' has spaces around its value (remove them)"},
        Refusal{"--save '$D/ckpt '", "--save='$D/ckpt ' has spaces around its value (remove them)"},
        // Two flags in one argument (a quoting slip: was a run saving into "ckpt --load=...").
        Refusal{"'--save=$D/ckpt --load=$D/old'",
                "--save='$D/ckpt --load=$D/old' holds another flag ('--load=$D/old'): give each "
                "flag its own argument"},
        // A comment after a flag would be part of its value (was a directory "ckpt # keep").
        Refusal{"--flagfile=$D/note.flags",
                "$D/note.flags:2: '--save=ckpt # keep': a comment must be a line of its own (# "
                "at its start)",
                [](const std::string& d) {
                  WriteFile(d + "/note.flags", "--num_layers=2\n--save=ckpt # keep\n");
                }},
        // An empty entry in a --flagfile list (a trailing comma was skipped, a leading one was
        // "--flagfile=: no such file").
        Refusal{"--flagfile=$D/a.flags,", "--flagfile=$D/a.flags, has an empty entry",
                [](const std::string& d) { WriteFile(d + "/a.flags", "--num_layers=2\n"); }}));

// gflags' help flags set so that they ask for nothing (--version=false, --helpon=) run as if not
// given (they exited 0 having done nothing), and a flagfile that begins with a UTF-8 byte-order
// mark reads as one without it (its first line was "not a flag").
TEST(MoeTrainTest, HelpFlagsThatAskForNothingAndAByteOrderMarkRun) {
  const ScopedTempDir dir;
  WriteFile(dir.Path("bom.flags"), "\xEF\xBB\xBF--train_steps=1\n--eval_steps=1\n");
  const SplitCommandResult r =
      RunIn(dir,
            "--device=cpu --version=false --helpxml=false --helpon= --warmup_steps=0 "
            "--log_interval=1 --flagfile=" +
                dir.Path("bom.flags"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("step      1 | loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

// Issue 14, class 2: one case per row of the rule table (apps/moe_train/flag_rules.cc), in its
// order; the mpirun row (--device=cuda:N) is in moe_train_parallel_cli_test.cc.
std::vector<Refusal> RuleCases() {
  const std::string offload = " needs --offload_modules: without it nothing is offloaded";
  const std::string pipeline = " needs --pipeline_parallel > 1: ";
  const std::string moe =
      " needs MoE layers (--first_dense_layers < --num_layers): every layer "
      "is dense";
  std::vector<Refusal> cases = {
      {"--offload_min_tensor_bytes=0", "--offload_min_tensor_bytes=0" + offload},
      {"--offload_fraction=0.5", "--offload_fraction=0.5" + offload},
      {"--offload_pp_delta_bytes=1024", "--offload_pp_delta_bytes=1024" + offload},
      {"--offload_prefetch_layers=0", "--offload_prefetch_layers=0" + offload},
      {"--recompute_num_layers=1",
       "--recompute_num_layers=1 needs --recompute_modules: without it nothing is recomputed"},
      {"--offload_modules=core_attn --offload_pp_delta_bytes=1024",
       "--offload_pp_delta_bytes=1024" + pipeline + "it sets the bytes kept per pipeline rank"},
      {"--virtual_pipeline=2",
       "--virtual_pipeline=2" + pipeline + "chunks interleave across pipeline ranks"},
      {"--first_stage_layers=1",
       "--first_stage_layers=1" + pipeline + "one process holds every layer"},
      {"--last_stage_layers=1",
       "--last_stage_layers=1" + pipeline + "one process holds every layer"},
      {"--distributed_timeout_minutes=1",
       "--distributed_timeout_minutes=1 needs more than one rank (mpirun): one process waits for "
       "no peer"},
      {"--data_path=$D/tokens.bin",
       "--data_path=$D/tokens.bin needs --data_format=megatron|flat_u16|flat_u32: the synthetic "
       "data reads no file"},
      {"--save_interval=5", "--save_interval=5 needs --save: without it no checkpoint is written"},
      {"--trace_steps=1:1", "--trace_steps=1:1 needs --trace_file: without it nothing is traced"},
      {"--peak_flops=1e15", "--peak_flops=1e+15 needs a CUDA device: MFU is reported on CUDA only"},
  };
  for (const std::string flag :
       {"num_experts=8", "moe_router_topk=1", "moe_ffn_hidden_size=64", "moe_aux_loss_coeff=0.001",
        "moe_z_loss_coeff=0.001", "moe_grouped_mlp=unfused"}) {
    cases.push_back({"--first_dense_layers=2 --" + flag, "--" + flag + moe});
  }
  cases.push_back(
      {"--first_dense_layers=2 --moe_wgrad_micro_batches=2", "--moe_wgrad_micro_batches=2" + moe});
  cases.push_back({"--moe_grouped_mlp=unfused --moe_wgrad_micro_batches=2",
                   "--moe_wgrad_micro_batches=2 needs --moe_grouped_mlp=fused: the unfused path "
                   "adds each micro-batch's weight gradients per expert"});
  cases.push_back({"--micro_batch_size=4 --global_batch_size=4 --moe_wgrad_micro_batches=2",
                   "--moe_wgrad_micro_batches=2 needs several micro-batches a step "
                   "(--global_batch_size > --micro_batch_size x data-parallel size): with one, "
                   "every backward is the step's last"});
  cases.push_back({"--first_dense_layers=0 --ffn_hidden_size=512",
                   "--ffn_hidden_size=512 needs dense layers (--first_dense_layers > 0): every "
                   "layer is MoE (its width is --moe_ffn_hidden_size)"});
  for (const std::string flag :
       {"train_steps=5", "global_batch_size=32", "lr=0.001", "min_lr=0.0001", "warmup_steps=2",
        "weight_decay=0", "clip_grad=0", "adam_beta2=0.99", "exp_avg_dtype=bf16", "eval_interval=5",
        "eval_steps=2", "save=$D/ckpt", "metrics_file=$D/m.jsonl", "log_interval=5",
        "trace_file=$D/t.json", "offload_modules=core_attn", "moe_wgrad_micro_batches=2",
        "exit_interval=5", "exit_duration_in_mins=1"}) {
    cases.push_back({"--dump_reference_case=$D/ref --" + flag,
                     "--" + flag +
                         " needs a training run (not --dump_reference_case): it is "
                         "unused there"});
  }
  cases.push_back({"--dry_run_world_size=4",
                   "--dry_run_world_size=4 needs --dry_run: a run's world size is the number of "
                   "processes mpirun starts"});
  cases.push_back({"--dry_run_device_memory_gib=40",
                   "--dry_run_device_memory_gib=40 needs --dry_run: a run checks the memory of "
                   "the device it has"});
  cases.push_back({"--dry_run_json",
                   "--dry_run_json=true needs --dry_run: without it there is no dry-run report"});
  cases.push_back({"--dry_run --dump_reference_case=$D/ref",
                   "--dump_reference_case=$D/ref needs no --dry_run: a dry run computes nothing"});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(RuleTable, RefusalTest, ::testing::ValuesIn(RuleCases()));

// Issue 14, class 5: every numeric flag has a range (flag_table.cc), enforced; one value outside
// each. NaN and infinities are outside every range.
std::vector<Refusal> RangeCases() {
  const std::vector<std::pair<std::string, std::string>> outside = {
      {"num_layers=0", "[1, 1048576]"},
      {"hidden_size=0", "[1, 1048576]"},
      {"num_attention_heads=0", "[1, 65536]"},
      {"num_query_groups=0", "[1, 65536]"},
      {"ffn_hidden_size=0", "[1, 16777216]"},
      {"num_experts=70000", "[1, 65536]"},
      {"moe_router_topk=0", "[1, 65536]"},
      {"moe_ffn_hidden_size=-1", "[1, 16777216]"},
      {"moe_aux_loss_coeff=-0.5", "[0, 100]"},
      {"moe_z_loss_coeff=nan", "[0, 100]"},
      {"first_dense_layers=-1", "[0, 1048576]"},
      {"seq_length=0", "[1, 16777216]"},
      {"vocab_size=2147483648", "[2, 2147483647]"},
      {"micro_batch_size=0", "[1, 1048576]"},
      {"global_batch_size=-8", "[1, 1073741824]"},
      {"train_steps=0", "[1, 1099511627776]"},
      {"lr=inf", "[1e-10, 10]"},
      {"lr=-1", "[1e-10, 10]"},
      {"min_lr=-0.1", "[0, 10]"},
      {"warmup_steps=-1", "[0, 1099511627776]"},
      {"weight_decay=-1", "[0, 10]"},
      {"clip_grad=inf", "[0, 1000000]"},
      {"adam_beta1=1", "[0, 1)"},
      {"adam_beta2=-0.1", "[0, 1)"},
      {"adam_eps=0", "(0, 1]"},
      {"seed=-1", "[0, 9223372036854775807]"},
      {"pipeline_parallel=0", "[1, 4096]"},
      {"virtual_pipeline=0", "[1, 1024]"},
      {"first_stage_layers=-2", "[-1, 1048576]"},
      {"last_stage_layers=-5", "[-1, 1048576]"},
      {"eval_interval=-1", "[0, 1099511627776]"},
      {"eval_steps=0", "[1, 1048576]"},
      {"save_interval=-1", "[0, 1099511627776]"},
      {"log_interval=0", "[1, 1099511627776]"},
      {"peak_flops=0", "(0, 1e+18]"},
      {"offload_min_tensor_bytes=-1", "[0, 1125899906842624]"},
      {"offload_fraction=1.5", "[0, 1]"},
      {"offload_pp_delta_bytes=-1", "[0, 1125899906842624]"},
      {"offload_prefetch_layers=-1", "[0, 1048576]"},
      {"moe_wgrad_micro_batches=0", "[1, 1024]"},
      {"recompute_num_layers=-2", "[-1, 1048576]"},
      {"exit_interval=-1", "[0, 1099511627776]"},
      {"exit_duration_in_mins=-1", "[0, 1000000]"},
      {"distributed_timeout_minutes=0", "(0, 10000]"},
      {"dry_run_world_size=0", "[1, 1048576]"},
      {"dry_run_device_memory_gib=-80", "(0, 1048576]"},
  };
  std::vector<Refusal> cases;
  for (const auto& [flag, range] : outside) {
    cases.push_back({"--" + flag, "--" + flag + " must be in " + range});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Ranges, RefusalTest, ::testing::ValuesIn(RangeCases()));

// Issue 14, class 3: outputs, checked before the first step.
INSTANTIATE_TEST_SUITE_P(
    Outputs, RefusalTest,
    ::testing::Values(
        Refusal{"--save=/sys/moe_train_ckpt",
                "--save /sys/moe_train_ckpt: cannot create it: directory /sys is not writable "
                "(..."},
        Refusal{"--save=$D/file", "--save $D/file exists and is not a directory",
                [](const std::string& d) { WriteFile(d + "/file", "x"); }},
        Refusal{"--save=$D/file/ckpt",
                "--save $D/file/ckpt: cannot create it: $D/file is not a directory",
                [](const std::string& d) { WriteFile(d + "/file", "x"); }},
        // Through a symlink to a file, as the OS takes the path (normalised, it would be $D/ckpt).
        Refusal{"--save=$D/link/../ckpt",
                "--save $D/link/../ckpt: cannot create it: $D/link is not a directory",
                [](const std::string& d) {
                  WriteFile(d + "/file", "x");
                  std::filesystem::create_symlink(d + "/file", d + "/link");
                }},
        Refusal{"--metrics_file=/sys/m.jsonl",
                "--metrics_file /sys/m.jsonl: directory /sys is not writable (..."},
        Refusal{"--metrics_file=$D/none/m.jsonl",
                "--metrics_file $D/none/m.jsonl: directory $D/none does not exist"},
        Refusal{"--trace_file=$D", "--trace_file $D: not a regular file"},
        Refusal{"--trace_file=$D/none/t.json",
                "--trace_file $D/none/t.json: directory $D/none does not exist"},
        // A name over the filesystem's 255-byte limit, found before the run, not at its save.
        Refusal{
            "--save=$D/ck/" + std::string(300, 'c'),
            "--save $D/ck/" + std::string(300, 'c') + ": cannot create it (File name too long)"},
        Refusal{"--metrics_file=$D/" + std::string(300, 'm'),
                "--metrics_file $D/" + std::string(300, 'm') +
                    ": cannot create it (File name too long)"},
        Refusal{"--dump_reference_case=$D/model",
                "--dump_reference_case $D/model holds other files ('tokenizer.json'): it takes a "
                "new or empty directory, or an earlier dump's",
                [](const std::string& d) {
                  fs::create_directories(d + "/model");
                  WriteFile(d + "/model/tokenizer.json", "{}");
                }},
        Refusal{"--trace_file=$D/notes.txt",
                "--trace_file $D/notes.txt exists and is not an output of this flag: refusing to "
                "replace it (remove it, or name a new file)",
                [](const std::string& d) { WriteFile(d + "/notes.txt", "not a trace\n"); }},
        // A mistyped --metrics_file naming the token data: refused, not appended to.
        Refusal{
            "--metrics_file=$D/tokens.bin",
            "--metrics_file $D/tokens.bin exists and is not an output of this flag: refusing "
            "to append to it (remove it, or name a new file)",
            [](const std::string& d) { WriteFile(d + "/tokens.bin", std::string(64, '\x07')); }},
        Refusal{"--metrics_file=$D/out.json --trace_file=$D/out.json",
                "--metrics_file and --trace_file name the same path $D/out.json"},
        // Only incomplete checkpoints: --load would not resume, so it is not suggested (a
        // root with a complete one: MoeTrainTest.ASecondRunIntoTheSameSaveIsRefusedUnless...).
        Refusal{"--save=$D/ckpt",
                "--save $D/ckpt holds checkpoints, none of them complete (cannot read "
                "'$D/ckpt/step_00000004/state.json'): remove them, or save to a new directory",
                [](const std::string& d) {
                  fs::create_directories(d + "/ckpt/step_00000004");
                  WriteFile(d + "/ckpt/latest", "step_00000004\n");
                }},
        Refusal{"--save=$D/ckpt --load=$D/other",
                "--save $D/ckpt already holds checkpoints (up to step_00000004) of another run "
                "than --load=$D/other; save to a new directory",
                [](const std::string& d) { fs::create_directories(d + "/ckpt/step_00000004"); }},
        // A checkpoint's step directory, or a path in one, is not a root (a resumed run nested a
        // root of new checkpoints in the step directory it resumed from).
        Refusal{"--save=$D/ckpt/step_00000004 --load=$D/ckpt",
                "--save $D/ckpt/step_00000004 is a checkpoint's step directory: save to a "
                "checkpoint root or a new directory",
                [](const std::string& d) {
                  fs::create_directories(d + "/ckpt/step_00000004");
                  WriteFile(d + "/ckpt/step_00000004/state.json", "{}");
                  WriteFile(d + "/ckpt/latest", "step_00000004\n");
                }},
        Refusal{"--save=$D/ckpt/step_00000004/more",
                "--save $D/ckpt/step_00000004/more lies in a checkpoint's step directory "
                "($D/ckpt/step_00000004): save to a checkpoint root or a new directory",
                [](const std::string& d) {
                  fs::create_directories(d + "/ckpt/step_00000004");
                  WriteFile(d + "/ckpt/step_00000004/state.json", "{}");
                }},
        // The metrics file is created only once every check has passed.
        Refusal{"--metrics_file=$D/m.jsonl --save=$D/ckpt --seq_length=1000000",
                "the run needs at least about ..."}));

// Issue 14, class 4: too large for the machine, refused at start with the estimate.
INSTANTIATE_TEST_SUITE_P(
    Memory, RefusalTest,
    ::testing::Values(Refusal{"--seq_length=1000000",
                              "the run needs at least about 181.0 GiB (weights, "
                              "gradients and optimizer state 7.0 MiB, ..."},
                      Refusal{"--num_layers=100000",
                              "the run needs at least about 737.0 GiB (weights, "
                              "gradients and optimizer state 367.4 GiB, ..."}));

// A run that passes the estimate but finds less memory than it needs mid-step (here: a 1.5 GB
// address-space limit, which a build linked with the CUDA libraries also starts under, against
// about 3 GB that micro-batch 1536 needs) ends in one line and exit code 1, not an abort with a
// stack trace.
TEST(MoeTrainTest, AnAllocationThatFailsInAStepIsOneLineAndExitOne) {
  const ScopedTempDir dir;
  const SplitCommandResult r = testing::RunCommandSplit(
      "ulimit -v 1500000 && " + std::string(MOE_TRAIN_BINARY) +
      " --device=cpu --train_steps=1 --warmup_steps=0 --micro_batch_size=1536 "
      "--global_batch_size=1536 --eval_steps=1 --save=" +
      dir.Path("ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("moe_train: out of cpu memory allocating ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("the run does not fit (reduce --micro_batch_size"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.Path("ckpt/latest")));
}

// Trains `steps` steps of a small model into dir/ckpt.
void TrainInto(const ScopedTempDir& dir, int steps, const std::string& extra = "") {
  const SplitCommandResult r =
      RunIn(dir, "--device=cpu --warmup_steps=0 --eval_steps=1 --log_interval=1 --train_steps=" +
                     std::to_string(steps) + " --save=" + dir.Path("ckpt") + " " + extra);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

// Issue 14, class 1: a non-finite loss or gradient norm stops the run, exit 1, one line naming
// the step and the quantity; no checkpoint is written for it (nor after it).
TEST(MoeTrainTest, ANonFiniteLossStopsTheRunBeforeItIsSaved) {
  const ScopedTempDir dir;
  TrainInto(dir, 1);
  // Finite but huge (a checkpoint's NaN is refused at load): the logits overflow.
  ASSERT_GT(testing::OverwriteF32Tensors(dir.Path("ckpt/step_00000001/model.safetensors"),
                                         "final_norm", 3.4e38f),
            0);
  const std::vector<std::string> before = dir.List();
  const std::string latest = ReadFile(dir.Path("ckpt/latest"));
  const SplitCommandResult r =
      RunIn(dir,
            "--device=cpu --warmup_steps=0 --eval_steps=1 --train_steps=4 --save_interval=1 "
            "--save=" +
                dir.Path("ckpt") + " --load=" + dir.Path("ckpt") +
                " --metrics_file=" + dir.Path("m.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.err,
            "moe_train: step 2: loss is nan, gradient norm is nan; stopped before saving anything "
            "of it (lower --lr, or keep --clip_grad on)\n");
  EXPECT_EQ(r.out.find("saved checkpoint"), std::string::npos) << r.out;
  std::vector<std::string> after = dir.List();
  after.erase(std::remove(after.begin(), after.end(), "m.jsonl"), after.end());
  EXPECT_EQ(after, before);
  EXPECT_EQ(ReadFile(dir.Path("ckpt/latest")), latest);
}

// Issue 14, class 3: a second run into the same --save without --load would replace the first
// run's checkpoints: refused, naming --load; with --load it resumes there.
TEST(MoeTrainTest, ASecondRunIntoTheSameSaveIsRefusedUnlessItResumes) {
  const ScopedTempDir dir;
  TrainInto(dir, 2, "--save_interval=1");
  const std::string weights = ReadFile(dir.Path("ckpt/step_00000002/model.safetensors"));
  const std::vector<std::string> before = dir.List();
  const SplitCommandResult again =
      RunIn(dir, "--device=cpu --warmup_steps=0 --train_steps=2 --save=" + dir.Path("ckpt"));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_EQ(again.err, "moe_train: --save " + dir.Path("ckpt") +
                           " already holds checkpoints (up to step_00000002); resume with "
                           "--load=" +
                           dir.Path("ckpt") + ", or save to a new directory\n");
  EXPECT_EQ(dir.List(), before);
  EXPECT_EQ(ReadFile(dir.Path("ckpt/step_00000002/model.safetensors")), weights);
  const SplitCommandResult resumed =
      RunIn(dir, "--device=cpu --warmup_steps=0 --eval_steps=1 --train_steps=3 --save=" +
                     dir.Path("ckpt") + " --load=" + dir.Path("ckpt/step_00000001"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_TRUE(fs::exists(dir.Path("ckpt/step_00000003/model.safetensors")));
}

// Issue 14, class 6: a checkpoint of another shape names the fields that differ; --train_steps
// not beyond the checkpoint's step says so.
TEST(MoeTrainTest, ResumeProblemsNameWhatIsWrong) {
  const ScopedTempDir dir;
  TrainInto(dir, 1);
  const std::string step_dir = dir.Path("ckpt/step_00000001");
  ExpectRefused({"--load=" + dir.Path("ckpt") + " --train_steps=3 --hidden_size=64 --num_layers=3",
                 "--load " + step_dir +
                     ": the checkpoint's model differs in --hidden_size "
                     "(checkpoint 128, this run 64), --kv_channels (checkpoint 64, this run 32), "
                     "--num_layers "
                     "(checkpoint 2, this run 3)"});
  ExpectRefused({"--load=" + dir.Path("ckpt") + " --train_steps=1",
                 "--train_steps=1 is not beyond step 1 of --load " + step_dir +
                     ": nothing to train (--train_steps counts from step 0)"});
  ExpectRefused({"--load=" + dir.Path("ckpt") +
                     " --train_steps=4 --trace_file=" + dir.Path("t.json") + " --trace_steps=1:2",
                 "--trace_steps=1:2 starts at or before step 1 of --load " + step_dir +
                     ", where the run resumes"});
  // Counters no save writes: AdamW's step below 1 at the next update aborted the run.
  const std::string state_file = step_dir + "/state.json";
  const std::string state_text = ReadFile(state_file);
  nlohmann::json state = nlohmann::json::parse(state_text);
  state["optimizer_step"] = -5;
  WriteFile(state_file, state.dump());
  ExpectRefused(
      {"--load=" + dir.Path("ckpt") + " --train_steps=3",
       "--load " + step_dir + ": state.json's \"optimizer_step\" is not an integer >= 0"});
  state["optimizer_step"] = 7;
  WriteFile(state_file, state.dump());
  ExpectRefused(
      {"--load=" + dir.Path("ckpt") + " --train_steps=3",
       "--load " + step_dir + ": state.json's \"optimizer_step\" 7 is beyond its step 1"});
  // A step directory holding another step (renamed, or a damaged state.json) would resume there.
  state = nlohmann::json::parse(state_text);
  state["step"] = 5;
  WriteFile(state_file, state.dump());
  ExpectRefused({"--load=" + dir.Path("ckpt") + " --train_steps=7",
                 "--load " + step_dir +
                     ": state.json's \"step\" 5 is not its directory's (step_00000001: renamed or "
                     "damaged?)"});
  WriteFile(state_file, state_text);
  // Under another name (a copy kept as "best") it loads as the step it holds.
  fs::copy(step_dir, dir.Path("best"), fs::copy_options::recursive);
  const SplitCommandResult best =
      RunIn(dir, "--device=cpu --eval_steps=1 --train_steps=2 --load=" + dir.Path("best"));
  EXPECT_EQ(best.exit_code, 0) << best.out << best.err;
}

// A damaged checkpoint: a truncated tensor file is refused before any work (exit 2, naming
// --load), a NaN in its weights when it is loaded (exit 1, naming the tensor); neither trains.
TEST(MoeTrainTest, ADamagedCheckpointIsRefusedNamingTheFile) {
  const ScopedTempDir dir;
  TrainInto(dir, 1);
  const std::string model = dir.Path("ckpt/step_00000001/model.safetensors");
  const std::string whole = ReadFile(model);
  WriteFile(model, whole.substr(0, whole.size() - 100));
  ExpectRefused({"--load=" + dir.Path("ckpt") + " --train_steps=3",
                 "--load " + dir.Path("ckpt") + ": '" + model + "': tensor ..."});

  WriteFile(model, whole);
  ASSERT_GT(testing::OverwriteF32Tensors(model, "final_norm", std::nanf("")), 0);
  const SplitCommandResult r =
      RunIn(dir, "--device=cpu --eval_steps=1 --train_steps=3 --load=" + dir.Path("ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.err, "moe_train: --load " + dir.Path("ckpt") + ": tensor 'final_norm.weight' in '" +
                       model + "' holds a non-finite value (NaN or infinity) at element 0\n");
  EXPECT_EQ(r.out.find("step      2"), std::string::npos) << r.out;
}

// The losses of a run's metrics file, by step.
std::map<int64_t, double> LossesByStep(const std::string& metrics) {
  std::map<int64_t, double> losses;
  std::ifstream lines(metrics);
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) losses[record["step"]] = record["loss"];
  }
  return losses;
}

// The usual resume appends to the first run's metrics file (its own: it begins as a metrics file
// does, output_checks.h), which then holds every step once.
TEST(MoeTrainTest, AResumedRunAppendsToItsMetricsFile) {
  const ScopedTempDir dir;
  const std::string common =
      "--device=cpu --warmup_steps=0 --eval_interval=0 --eval_steps=1 --log_interval=1 "
      "--metrics_file=" +
      dir.Path("m.jsonl") + " ";
  const SplitCommandResult first =
      RunIn(dir, common + "--train_steps=2 --save=" + dir.Path("ckpt"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const SplitCommandResult resumed =
      RunIn(dir, common + "--train_steps=4 --load=" + dir.Path("ckpt"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const std::map<int64_t, double> losses = LossesByStep(dir.Path("m.jsonl"));
  EXPECT_EQ(losses.size(), 4u);
  for (int64_t step = 1; step <= 4; ++step) EXPECT_EQ(losses.count(step), 1u) << step;
}

// A resumed run continues the checkpoint's data stream: without --seed it takes the checkpoint's
// (noted) and reproduces the uninterrupted run's losses; another --seed given is noted.
TEST(MoeTrainTest, AResumeWithoutSeedContinuesTheCheckpointsDataOrder) {
  const ScopedTempDir dir;
  const std::string common =
      "--device=cpu --warmup_steps=0 --eval_interval=0 --eval_steps=1 --log_interval=1 "
      "--train_steps=4 ";
  const SplitCommandResult whole =
      RunIn(dir, common + "--seed=7 --save_interval=2 --save=" + dir.Path("ckpt") +
                     " --metrics_file=" + dir.Path("whole.jsonl"));
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const SplitCommandResult resumed =
      RunIn(dir, common + "--load=" + dir.Path("ckpt/step_00000002") +
                     " --metrics_file=" + dir.Path("resumed.jsonl"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resume: --seed=7, the checkpoint's (--seed not given): its data "
                             "order continues\n"),
            std::string::npos)
      << resumed.out;
  const std::map<int64_t, double> want = LossesByStep(dir.Path("whole.jsonl"));
  const std::map<int64_t, double> got = LossesByStep(dir.Path("resumed.jsonl"));
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [step, loss] : got) EXPECT_EQ(loss, want.at(step)) << "step " << step;

  const SplitCommandResult reseeded =
      RunIn(dir, common + "--seed=8 --load=" + dir.Path("ckpt/step_00000002"));
  ASSERT_EQ(reseeded.exit_code, 0) << reseeded.out << reseeded.err;
  EXPECT_NE(reseeded.out.find("resume: --seed=8 differs from the checkpoint's 7: a new data order "
                              "from step 2 (and a new synthetic chain)\n"),
            std::string::npos)
      << reseeded.out;
}

// Training flags given with another value than the checkpoint's run's are noted in one line
// (both values), so that a mistyped --lr does not change a resumed run unseen; the same values
// give no such note.
TEST(MoeTrainTest, AResumeNotesTrainingFlagsThatDifferFromTheCheckpoints) {
  const ScopedTempDir dir;
  const std::string common = "--device=cpu --eval_interval=0 --eval_steps=1 --train_steps=4 ";
  const SplitCommandResult first =
      RunIn(dir, common + "--lr=3e-3 --save_interval=2 --save=" + dir.Path("ckpt"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string load = " --load=" + dir.Path("ckpt/step_00000002");
  const SplitCommandResult same = RunIn(dir, common + "--lr=0.003" + load);
  ASSERT_EQ(same.exit_code, 0) << same.out << same.err;
  EXPECT_EQ(same.out.find("from the checkpoint's run"), std::string::npos) << same.out;
  const SplitCommandResult changed =
      RunIn(dir, common + "--lr=1e-3 --global_batch_size=32 --exp_avg_dtype=bf16" + load);
  ASSERT_EQ(changed.exit_code, 0) << changed.out << changed.err;
  EXPECT_NE(changed.out.find("resume: --lr=0.001 (checkpoint 0.003), --global_batch_size=32 "
                             "(checkpoint 16), --exp_avg_dtype=bf16 (checkpoint fp32) differ "
                             "from the checkpoint's run; from step 2 this run's values apply\n"),
            std::string::npos)
      << changed.out;
  const SplitCommandResult extended = RunIn(dir,
                                            "--device=cpu --eval_interval=0 --eval_steps=1 "
                                            "--train_steps=6 --lr=0.003" +
                                                load);
  ASSERT_EQ(extended.exit_code, 0) << extended.out << extended.err;
  EXPECT_NE(extended.out.find("resume: --train_steps=6 (checkpoint 4) differs from the "
                              "checkpoint's run; from step 2 this run's values apply\n"),
            std::string::npos)
      << extended.out;
}

// Issue 14, class 6: token files are checked where the format allows it.
TEST(MoeTrainTest, TokenFilesOfTheWrongWidthOrVocabularyAreRefused) {
  const ScopedTempDir dir;
  std::vector<uint32_t> u32(5000);
  for (size_t i = 0; i < u32.size(); ++i) u32[i] = (i * 7) % 256;
  WriteFile(dir.Path("u32.bin"), std::string(reinterpret_cast<const char*>(u32.data()), 20000));
  std::vector<uint16_t> u16(5000, 3);
  u16[1] = 5;
  WriteFile(dir.Path("u16.bin"), std::string(reinterpret_cast<const char*>(u16.data()), 10000));
  u16[1234] = 300;  // >= --vocab_size 256
  WriteFile(dir.Path("big.bin"), std::string(reinterpret_cast<const char*>(u16.data()), 10000));
  ExpectRefused({"--data_format=flat_u16 --data_path=" + dir.Path("u32.bin"),
                 "--data_path " + dir.Path("u32.bin") +
                     ": every second uint16 token is 0, as in "
                     "a file of uint32 tokens: that is --data_format=flat_u32"});
  ExpectRefused({"--data_format=flat_u32 --data_path=" + dir.Path("u16.bin"),
                 "--data_path " + dir.Path("u16.bin") +
                     ": token id 327683 at position 0 is "
                     "outside [0, --vocab_size 256) (a file of uint16 tokens? that is "
                     "--data_format=flat_u16)"});
  ExpectRefused({"--data_format=flat_u16 --data_path=" + dir.Path("big.bin"),
                 "--data_path " + dir.Path("big.bin") +
                     ": token id 300 at position 1234 is "
                     "outside [0, --vocab_size 256)"});
}

// Issue 14, class 5: the seed and learning rates the log prints are accepted back and give the
// same run.
TEST(MoeTrainTest, WhatTheLogPrintsCanBePassedBack) {
  const ScopedTempDir dir;
  const std::string common =
      "--device=cpu --train_steps=2 --warmup_steps=0 --log_interval=1 --eval_steps=1 ";
  const SplitCommandResult first =
      RunIn(dir, common + "--seed=9223372036854775807 --lr=0.00123456789 --min_lr=1e-05");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::smatch lr, seed;
  ASSERT_TRUE(std::regex_search(first.out, lr, std::regex(R"(lr (\S+) -> (\S+) \()"))) << first.out;
  ASSERT_TRUE(std::regex_search(first.out, seed, std::regex(R"(seed (\d+))"))) << first.out;
  EXPECT_EQ(lr[1], "0.00123456789");
  EXPECT_EQ(lr[2], "1e-05");
  EXPECT_EQ(seed[1], "9223372036854775807");
  const SplitCommandResult again =
      RunIn(dir, common + "--seed=" + seed[1].str() + " --lr=" + lr[1].str() +
                     " --min_lr=" + lr[2].str());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const std::regex loss(R"(loss [0-9.]+ \| aux [0-9.]+ \| lr \S+ \| grad norm [0-9.]+)");
  std::vector<std::string> a, b;
  for (std::sregex_iterator it(first.out.begin(), first.out.end(), loss), end; it != end; ++it) {
    a.push_back(it->str());
  }
  for (std::sregex_iterator it(again.out.begin(), again.out.end(), loss), end; it != end; ++it) {
    b.push_back(it->str());
  }
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
}

// The AdamW flags reach the optimizer: the log names them as they can be passed back, the
// defaults given explicitly change nothing, and each flag changes the run: eps from the first
// update on (step 2's loss), the betas from the second (step 3's; a first Adam update does not
// depend on them).
TEST(MoeTrainTest, AdamWFlagsReachTheOptimizer) {
  const ScopedTempDir dir;
  const std::string common =
      "--device=cpu --train_steps=3 --warmup_steps=0 --log_interval=1 --eval_steps=1 ";
  const auto steps = [&](const std::string& flags, std::string* log = nullptr) {
    const SplitCommandResult r = RunIn(dir, common + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (log != nullptr) *log = r.out;
    std::vector<std::string> found;
    const std::regex step(R"(loss [0-9.]+ \| aux [0-9.]+ \| lr \S+ \| grad norm [0-9.]+)");
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), step), end; it != end; ++it) {
      found.push_back(it->str());
    }
    return found;
  };
  std::string log;
  const std::vector<std::string> defaults = steps("", &log);
  EXPECT_NE(log.find("optimizer: AdamW, betas 0.9, 0.95, eps 1e-08, weight decay 0.1, gradient "
                     "clip 1\n"),
            std::string::npos)
      << log;
  ASSERT_EQ(defaults.size(), 3u);
  EXPECT_EQ(steps("--adam_beta1=0.9 --adam_beta2=0.95 --adam_eps=1e-08"), defaults);
  for (const auto& [flag, first_changed] : std::vector<std::pair<std::string, size_t>>{
           {"--adam_eps=1", 1}, {"--adam_beta1=0", 2}, {"--adam_beta2=0.5", 2}}) {
    const std::vector<std::string> other = steps(flag);
    ASSERT_EQ(other.size(), 3u) << flag;
    for (size_t i = 0; i < 3; ++i) {
      if (i < first_changed) {
        EXPECT_EQ(other[i], defaults[i]) << flag << ", step " << i + 1;
      } else {
        EXPECT_NE(other[i], defaults[i]) << flag << ", step " << i + 1;
      }
    }
  }
}

// Issue 14, class 7: --help and -h show the project's flags first, grouped as in README.md,
// each numeric one with its range; --helpshort lists them by group.
TEST(MoeTrainTest, HelpShowsTheProjectsFlagsFirst) {
  const ScopedTempDir dir;
  const SplitCommandResult help = RunIn(dir, "--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.err, "");
  EXPECT_EQ(help.out.rfind("moe_train: trains a Mixture-of-Experts GPT", 0), 0u) << help.out;
  size_t last = 0;
  for (const std::string group :
       {"\nmodel:\n  --num_layers=2\n", "\nexpert layer:\n", "\ntraining:\n", "\nparallelism:\n",
        "\ndata:\n", "\neval, checkpoints:\n", "\nseeing a step:\n", "\noffloading:\n",
        "\nrecompute:\n", "\ndry run:\n  --dry_run=false\n"}) {
    const size_t at = help.out.find(group);
    ASSERT_NE(at, std::string::npos) << group << help.out;
    EXPECT_GT(at, last) << group;
    last = at;
  }
  EXPECT_NE(help.out.find("  --seed=1234\n      seed of the initial weights and the data order; "
                          "in [0, 9223372036854775807]\n"),
            std::string::npos)
      << help.out;
  EXPECT_EQ(help.out.find("no range documented"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("\nother:"), std::string::npos) << "a flag outside the table";
  // Each flag's range and note once: its description repeats neither (was "in [0, 1]; in [0, 1]").
  EXPECT_NE(help.out.find("  --offload_fraction=1\n      fraction of the offload groups (layer x "
                          "module) kept offloaded, earliest in forward order first; in [0, 1]\n"),
            std::string::npos)
      << help.out;
  std::istringstream lines(help.out);
  for (std::string line; std::getline(lines, line);) {
    const size_t range = line.find("; in ");
    if (line.rfind("      ", 0) != 0 || range == std::string::npos) continue;
    const std::string description = line.substr(0, range);
    EXPECT_EQ(description.find("in ["), std::string::npos) << line;
    const size_t range_end = line.find_first_of("])", range);
    if (line.compare(range_end + 1, 2, ", ") == 0) {
      EXPECT_EQ(description.find(line.substr(range_end + 3)), std::string::npos) << line;
    }
  }
  EXPECT_EQ(help.out.find("logtostderr"), std::string::npos) << "glog's flags come with --helpfull";
  EXPECT_EQ(RunIn(dir, "-h").out, help.out);
  const SplitCommandResult short_help = RunIn(dir, "--helpshort");
  EXPECT_EQ(short_help.exit_code, 0);
  EXPECT_NE(short_help.out.find("\noffloading: --offload_modules --offload_min_tensor_bytes"),
            std::string::npos)
      << short_help.out;
  EXPECT_EQ(short_help.out.find("No modules matched"), std::string::npos);
  const SplitCommandResult full = RunIn(dir, "--helpfull");
  EXPECT_EQ(full.exit_code, 0);
  EXPECT_LT(full.out.find("\nmodel:\n"), full.out.find("logtostderr")) << full.out;
  EXPECT_EQ(dir.List(), std::vector<std::string>{});
}

// Issue 14, class 7: a smoke run of a preset shorter than its warmup runs, with warmup clamped
// to the run and one log line saying so.
TEST(MoeTrainTest, ASmokeRunOfAPresetClampsTheWarmup) {
  const ScopedTempDir dir;
  const SplitCommandResult r =
      RunIn(dir, "--flagfile=" + ConfigPath("tiny.flags") + " --device=cpu --train_steps=5");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("schedule: steps 5 from 0, lr 0.003 -> 0.0003 (warmup 5, cosine)\n"
                       "schedule: --warmup_steps=20 is longer than the run (--train_steps=5): "
                       "warmup clamped to 5 steps\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step      5 | loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

// CI trains the tiny preset with the blockwise FP8 recipe: the log says so, and its validation
// loss after 100 steps is the plain run's within 1%.
TEST(MoeTrainTest, TheTinyPresetTrainsWithTheFp8Recipe) {
  const ScopedTempDir dir;
  const std::string run = "--flagfile=" + ConfigPath("tiny.flags") +
                          " --device=cpu --train_steps=100 --log_interval=50 --eval_interval=100";
  const SplitCommandResult plain = RunIn(dir, run);
  const SplitCommandResult fp8 = RunIn(dir, run + " --fp8_recipe=blockwise");
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  ASSERT_EQ(fp8.exit_code, 0) << fp8.out << fp8.err;
  EXPECT_NE(fp8.out.find("fused grouped MLP, FP8 blockwise e4m3"), std::string::npos) << fp8.out;
  const auto validation = [](const std::string& out) {
    const size_t at = out.rfind("validation loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 16));
  };
  const double want = validation(plain.out), got = validation(fp8.out);
  ASSERT_GT(want, 0) << plain.out;
  EXPECT_NEAR(got, want, 0.01 * want) << fp8.out;
  EXPECT_NE(got, want) << "the recipe changed nothing";
}

TEST(MoeTrainTest, RunsLogsWritesMetricsAndResumes) {
  const ScopedTempDir dir;
  const std::string metrics = dir.Path("metrics.jsonl");
  const std::string root = dir.Path("ckpt");
  const std::string common =
      "--device=cpu --log_interval=2 --eval_interval=4 --eval_steps=1 "
      "--micro_batch_size=2 --global_batch_size=4 --warmup_steps=2 "
      "--metrics_file=" +
      metrics + " --save=" + root;
  const SplitCommandResult first = RunIn(dir, common + " --train_steps=4");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("parameters:"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("(fused grouped MLP)"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("entropy floor"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("tokens/s"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("validation loss"), std::string::npos) << first.out;
  EXPECT_TRUE(fs::exists(root + "/step_00000004/model.safetensors"));

  const SplitCommandResult resumed = RunIn(dir, common + " --train_steps=6 --load=" + root);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("step      6"), std::string::npos) << resumed.out;
  EXPECT_EQ(resumed.out.find("step      2 "), std::string::npos) << "restarted: " << resumed.out;

  std::ifstream lines(metrics);
  std::string line;
  int records = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_TRUE(record.contains("step"));
    ++records;
  }
  EXPECT_EQ(records, 2 + 1 + 1 + 1);  // steps 2, 4; eval 4; step 6; eval 6
}

}  // namespace
}  // namespace moe
