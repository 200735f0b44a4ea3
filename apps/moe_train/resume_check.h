// --load, checked before any work (Trainer::Load then only restores RunConfig::resume_dir): the
// path resolves to a checkpoint (engine/io/checkpoint.h: a root resolves to its newest complete
// step directory, with a note when that is not the one its `latest` names) whose state.json
// parses, with counters a save writes (step, optimizer_step <= step, consumed_train_samples:
// integers >= 0), and whose tensor files' headers are whole (a truncated or corrupt file is
// refused here, not after the model is built); its model shape equals this run's, else one line
// naming each field that differs as its flag, with both values ("--load ckpt: the checkpoint's
// model differs in --hidden_size (checkpoint 64, this run 128)"); --train_steps is beyond the
// checkpoint's step, else the run would end having trained nothing (unless
// --dump_reference_case, which does not train); and --trace_steps lie after that step. --load
// naming the --save root while it holds no checkpoint yet (no step directory, no `latest`) trains
// from step 0, with a note: one command line then serves a job's first start and every restart.
//
// A weights-only checkpoint (modules/checkpoint_state.h: an hf_convert import) is refused
// without --finetune, in one line that says to add it. With --finetune (Megatron-LM's: the
// weights alone; Trainer::LoadWeights) only the fields that set parameter names and shapes must
// equal this run's (another --seq_length, --rotary_base, --norm_epsilon, --moe_router_topk or
// --moe_router_pre_softmax is noted and used); the run starts at step 0 with a fresh optimizer and
// its own seed's data order, so no counter, --train_steps or --trace_steps check applies; and
// --save must be another directory than --load (a restart resumes from --save without
// --finetune).
//
// The resumed run continues the checkpoint's data stream: its seed keys the data order (and, for
// --data_format=synthetic, the Markov chain itself), so a run that does not give --seed takes the
// checkpoint's, with a note. A --seed or data source (--data_format, --data_path) given that
// differs from the checkpoint's is the user's choice, also noted: the consumed-sample count
// carries over into the new order. So are training flags (the optimizer and its schedule, the
// batch, the loss coefficients, the state's precision) whose value differs from the checkpoint's
// run's: one note naming each with both values ("resume: --lr=0.001 (checkpoint 0.003) differs
// ..."), so that a mistyped value does not change a resumed run unseen; --train_steps among them,
// as the learning-rate schedule ends there.
#pragma once

#include "apps/moe_train/run_flags.h"
#include "engine/core/status.h"

namespace moe {

Status CheckResume(RunConfig* run);

}  // namespace moe
