// moe_train --dry_run: what a run's layout would need on each rank of a machine it is not run on,
// computed from the flags alone: no MPI, no device, no model memory; a 30B-parameter model takes
// milliseconds. The world size is --dry_run_world_size (data parallel = it / --pipeline_parallel),
// the device's memory --dry_run_device_memory_gib, and --device=auto means the target's GPU (a
// CUDA estimate: bf16 compute) even where this process has none.
//
// The flags are checked as a run of that many ranks checks them (ValidateFlags in dry-run mode,
// run_flags.h, and the layout's checks, memory_check.h's EstimateRunMemory), so a flag or layout
// the run would refuse is the same one line (exit code 2). Flags that name the target machine's
// files (--save, --load, --data_path, --metrics_file, --trace_file) are accepted and not looked
// at; --dump_reference_case, another mode, is refused.
//
// The report (stdout; --dry_run_json: the same as one JSON object):
// - the layout, the model, parameters (total, active per token) and the batch, as a run prints
//   them (run_summary.h);
// - per pipeline rank (modules/layout_estimate.h, the figures moe_train checks at start; under
//   --expert_model_parallel_size, a rank's share of the experts): its layers (and ends: emb,
//   head), parameters, bytes of weights, gradients, optimizer state (AdamW
//   moments and, on CUDA, f32 master weights; sharded under --use_distributed_optimizer),
//   activations with the passes the schedule holds in flight (recompute as the flags say;
//   offloading by hand not subtracted), workspace and their total; then moe_train's start-up
//   "memory:" line, word for word;
// - with --memory_budget_gib, the memory planner's plan (modules/memory_planner.h): per rank its
//   predicted peak and cost, as a run prints them, and what it offloads and recomputes in which
//   layers;
// - one verdict line, from the checks a run makes at start (memory_check.h) against the given
//   device: "fits in 80 GiB (78.4 GiB usable) with 12.3 GiB to spare ...", or "does not fit in
//   80 GiB: ...; smallest change that fits: ..." (the first of --use_distributed_optimizer, a
//   larger --expert_model_parallel_size, a --memory_budget_gib of the usable memory, a smaller
//   --micro_batch_size, a larger --pipeline_parallel that fits, each alone). A layout that does not
//   fit is a result: Ok.
#pragma once

#include <gflags/gflags.h>

#include "engine/core/status.h"

DECLARE_bool(dry_run);

namespace moe {

// The report on stdout, or the first flag or layout problem (nothing printed).
Status DryRun();

}  // namespace moe
