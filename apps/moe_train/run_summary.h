// What moe_train's start-up summary (RunLog::Summary) says of the run's shape, one text each for
// the lines it prints after "moe_train: ", "model: ", "parameters: ", "batch: " and "parallel: "
// (and --dry_run, dry_run.h, prints). The preset flagfiles
// (configs/*.flags) quote these lines in their header comments; tests/apps/presets_test.cc
// checks the quotes against these functions.
#pragma once

#include <string>

#include "apps/moe_train/run_flags.h"
#include "modules/gpt_config.h"

namespace moe {

// "8 layers (1 dense, 7 MoE), hidden 512, heads 8 (kv 4), experts 8 top-2 (fused grouped MLP),
// expert ffn 1024, seq 1024, vocab 32000"; the attention's parentheses add ", head dim 128" where
// heads x head dim is not the hidden size and ", QK norm" (", QK norm across heads"), the
// experts' "pre-softmax, " with --moe_router_pre_softmax.
std::string ModelSummary(const GptConfig& m);
// "130.32M total, 64.26M active per token" (GptConfig::total_parameters, active_parameters).
std::string ParameterCounts(const GptConfig& m);
// "micro 8 x accumulation 2 x data-parallel 1 = 16 sequences, 1024 tokens/step".
std::string BatchSummary(const RunConfig& run);
// "cpu, f32 compute; gradients f32; AdamW moments exp_avg f32, exp_avg_sq f32".
std::string PrecisionSummary(const RunConfig& run);
// "4 ranks = pipeline 2 x data 2; 1 chunk(s) per pipeline rank, schedule 1f1b".
std::string ParallelSummary(const RunConfig& run);

}  // namespace moe
