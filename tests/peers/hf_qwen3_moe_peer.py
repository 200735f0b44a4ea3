"""Peer of moe_train as most users would start: transformers' own Qwen3MoeForCausalLM training
step on one GPU, randomly initialised at the real Qwen3-30B-A3B layer shape (hidden 2048, 32 query
heads of dimension 128, 4 key/value heads, per-head query/key RMSNorm, rotary base 1e6, 128 experts
top-8 renormalised, expert width 768, vocabulary 151936, untied head) cut to LAYERS layers.
bf16 parameters, gradients and AdamW moments (fused torch AdamW, no fp32 master weights), the same
precision as torch_moe_model_peer.py. Each step: ACCUM micro-batches of MBS x SEQ random tokens,
loss (labels = inputs, plus the router's load-balancing loss, coefficient 1e-3) / ACCUM, backward;
then the optimizer step.

Timed: wall clock over STEPS steps after WARMUP untimed ones; peak memory over the timed steps.
FLOPs per token as moe_train counts them (peer_timing.moe_decoder_flops: 6 x active parameters +
causal attention 6 x LAYERS x SEQ x 32 x 128), read from the built model's config; MFU against
989 TFLOP/s.

Environment: LAYERS (8), ACCUM (8), MBS (1), SEQ (4096), WARMUP (2), STEPS (3),
ATTN attention implementation (sdpa), EXPERTS_IMPL experts implementation (unset: transformers'
default; e.g. eager, grouped_mm, batched_mm where the installed transformers has them).
Prints a JSON header (versions, parameters, active, flops_per_token, implementations), then
SUMMARY {ms_per_step, tokens_per_s, mfu_989, peak_GiB} (or {"error": ...})."""
import json
import os

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from peer_timing import env_int, moe_decoder_flops, time_training, training_figures


def main():
    layers, accum, mbs, seq = (env_int(k, v) for k, v in
                               (("LAYERS", 8), ("ACCUM", 8), ("MBS", 1), ("SEQ", 4096)))
    config = Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, intermediate_size=6144, norm_topk_prob=True, rope_theta=1e6,
        max_position_embeddings=seq, tie_word_embeddings=False, output_router_logits=True,
        router_aux_loss_coef=1e-3)
    config._attn_implementation = os.environ.get("ATTN", "sdpa")
    if os.environ.get("EXPERTS_IMPL"):
        config._experts_implementation = os.environ["EXPERTS_IMPL"]
    torch.manual_seed(0)
    # Built on the GPU in bf16 directly (a CPU float32 build of ~5B parameters takes long).
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.to(torch.bfloat16).train()
    attention = model.model.layers[0].self_attn
    head_dim = attention.q_proj.out_features // config.num_attention_heads
    if head_dim != 128:
        raise SystemExit(f"the model was built with head dim {head_dim}, not 128: this "
                         f"transformers ignores head_dim; the FLOP count would be wrong")
    active, flops_per_token = moe_decoder_flops(
        config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
        layers, config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
        config.vocab_size, seq)
    print(json.dumps(dict(transformers=transformers.__version__, torch=torch.__version__,
                          params=sum(p.numel() for p in model.parameters()), active=active,
                          flops_per_token=flops_per_token, layers=layers, accum=accum, mbs=mbs,
                          seq=seq, attn=config._attn_implementation,
                          experts_impl=getattr(config, "_experts_implementation", None),
                          qk_norm=type(attention.q_norm).__name__,
                          rope=getattr(config, "rope_parameters", None)
                          or getattr(config, "rope_theta", None))), flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        for _ in range(accum):
            ids = torch.randint(0, config.vocab_size, (mbs, seq), device="cuda")
            (model(input_ids=ids, labels=ids).loss / accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        result = training_figures(time_training(step, env_int("WARMUP", 2), env_int("STEPS", 3)),
                                  accum * mbs * seq, flops_per_token)
    except Exception as error:  # noqa: BLE001 - reported on the SUMMARY line
        result = dict(error=repr(error)[:400])
    print("SUMMARY " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
