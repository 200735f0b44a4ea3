#!/usr/bin/env python3
"""Tiny random Hugging Face MoE models, and what transformers computes on them.

For each of Qwen3MoeForCausalLM, MixtralForCausalLM and OlmoeForCausalLM: a float32 model of 2
layers, 4 experts top-2, vocabulary 128, every weight drawn here from a fixed seed (norm weights
1 + 0.1 N(0,1) so a wrong norm mapping cannot hide behind ones, router weights N(0, 0.25^2) so
routing is decided, the rest N(0, 0.1^2)), saved with save_pretrained() into OUT/<model_type>/,
with:
  tokens.u32     330 little-endian uint32 tokens: moe_train's first micro-batch of this file
                 with --micro_batch_size=2 --seq_length=32 --seed=1234 (hf_common.py, 1) is
                 exactly expected.json's "tokens";
  expected.json  tokens ([2][33]: inputs [:32], targets [1:]), loss (mean cross-entropy over
                 the 64 targets, float64 from the float32 logits of eager attention and eager
                 experts on the CPU), grads ({key: {shape, norm, first: 8 values row-major}}
                 under our names, key grammar in hf_common.py, 3), grad_norms (every parameter,
                 our names), moe_train_flags (the model flags our trainer needs), on_disk (every
                 tensor save_pretrained wrote: dtype, shape), config (its config.json), versions.
The model is reloaded with from_pretrained() and must give the same loss and gradients, with no
missing, unexpected or mismatched key: so the directory is what this transformers reads.

Shapes: Qwen3-MoE and Mixtral hidden 64, 2 query heads of head_dim 64 (so heads x head_dim =
128 != hidden), 1 key/value head, expert width 32; OLMoE hidden 128, 2 heads of 64 (its q_norm
spans hidden_size = heads x head_dim, so head_dim must be hidden / heads), 1 key/value head,
expert width 32. Head dim 64: moe_train's CUDA attention takes 64 or 128.

usage: python3 tests/hf/make_fixtures.py --out DIR [--models qwen3_moe,mixtral,olmoe]
Deterministic: the same transformers and torch write the same files.
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_common as hc  # noqa: E402

SEED = 20261205
SEQ_LENGTH = 32
MICRO_BATCH = 2
NUM_TOKENS = 330  # 9 train windows and 1 validation window of 33 (hf_common.py, 1)
INIT_STD = 0.1
ROUTER_STD = 0.25
NORM_NOISE = 0.1
COMMON = dict(vocab_size=128, num_hidden_layers=2, max_position_embeddings=128,
              initializer_range=INIT_STD, tie_word_embeddings=False, attention_dropout=0.0,
              output_router_logits=False, router_aux_loss_coef=0.0, use_cache=False,
              pad_token_id=None, bos_token_id=None, eos_token_id=None, hidden_act="silu")
SPECS = {
    "qwen3_moe": dict(
        config="Qwen3MoeConfig", model="Qwen3MoeForCausalLM", rope_theta=1e6, head_dim=64,
        kwargs=dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    intermediate_size=96, norm_topk_prob=True, rms_norm_eps=1e-6,
                    attention_bias=False, use_sliding_window=False, sliding_window=None,
                    decoder_sparse_step=1, mlp_only_layers=[])),
    "mixtral": dict(
        config="MixtralConfig", model="MixtralForCausalLM", rope_theta=1e6, head_dim=64,
        kwargs=dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                    rms_norm_eps=1e-5, sliding_window=None, router_jitter_noise=0.0)),
    "olmoe": dict(
        config="OlmoeConfig", model="OlmoeForCausalLM", rope_theta=10000.0, head_dim=64,
        kwargs=dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                    num_experts=4, num_experts_per_tok=2, intermediate_size=32,
                    norm_topk_prob=False, rms_norm_eps=1e-5, clip_qkv=None,
                    attention_bias=False)),
}
# expected.json "grads": the named weights (key grammar: hf_common.py, 3).
FFN = 32
GRAD_KEYS = ["embedding.weight", "layers.0.attention.q_proj.weight",
             "layers.0.attention.q_norm.weight", "layers.0.attention.k_norm.weight",
             "layers.1.moe.router.weight", "layers.1.moe.experts.fc1.weight[0]",
             f"layers.1.moe.experts.fc1.weight[0][0:{FFN}]",
             f"layers.1.moe.experts.fc1.weight[0][{FFN}:{2 * FFN}]",
             "layers.1.moe.experts.fc2.weight[0]", "final_norm.weight", "lm_head.weight"]


def build_config(spec):
    cls = getattr(transformers, spec["config"])
    kwargs = dict(COMMON, **spec["kwargs"])
    theta = spec["rope_theta"]
    config = None
    try:  # transformers 5: the rotary base lives in rope_parameters
        config = cls(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except (TypeError, ValueError) as error:
        print(f"note: {spec['config']}(rope_parameters=...) refused ({error!r}); using rope_theta")
    if config is None or hc.rope_theta(config.to_dict()) != theta:
        config = cls(**kwargs, rope_theta=theta)
    got = hc.rope_theta(config.to_dict())
    if got != theta:
        raise SystemExit(f"{spec['config']}: rotary base {got}, wanted {theta}")
    config._attn_implementation = "eager"
    return config


def draw_weights(model, generator):
    """Every parameter drawn here (independent of transformers' initialisation)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                value = 1.0 + NORM_NOISE * torch.randn(p.shape, generator=generator)
            elif name.endswith(".gate.weight") and (".mlp." in name or ".block_sparse_moe." in name):
                value = ROUTER_STD * torch.randn(p.shape, generator=generator)
            else:
                value = INIT_STD * torch.randn(p.shape, generator=generator)
            p.copy_(value.to(p.dtype))


def check_structure(model, spec, config):
    """What the fixture claims of the model, read back from the built modules."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    attention = model.model.layers[0].self_attn
    head_dim = spec["head_dim"]
    problems = []
    if attention.q_proj.out_features != heads * head_dim:
        problems.append(f"q_proj has {attention.q_proj.out_features} outputs, not {heads} x {head_dim}")
    if attention.k_proj.out_features != kv * head_dim:
        problems.append(f"k_proj has {attention.k_proj.out_features} outputs, not {kv} x {head_dim}")
    for norm in ("q_norm", "k_norm"):
        module = getattr(attention, norm, None)
        if module is not None:
            print(f"  {norm}: {tuple(module.weight.shape)}")
    if model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        problems.append("lm_head is tied to the embedding")
    if getattr(model.model.embed_tokens, "padding_idx", None) is not None:
        problems.append(f"the embedding has padding_idx {model.model.embed_tokens.padding_idx}")
    theta = spec["rope_theta"]
    for name, buffer in model.named_buffers():
        if name.endswith("inv_freq"):
            d = buffer.numel() * 2
            want = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            if d != head_dim or not torch.allclose(buffer.double(), want, rtol=1e-5, atol=0):
                problems.append(f"{name}: not rotate-half RoPE of base {theta} over {head_dim}")
    if problems:
        raise SystemExit(f"{spec['model']}: " + "; ".join(problems))


def grad_entry(tensor):
    flat = tensor.detach().double().flatten()
    return {"shape": list(tensor.shape), "norm": float(flat.norm()),
            "first": [float(v) for v in flat[:8]]}


def make_one(model_type, index, out):
    spec = SPECS[model_type]
    directory = os.path.join(out, model_type)
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    config = build_config(spec)
    torch.manual_seed(SEED + index)
    model = getattr(transformers, spec["model"])(config).to(torch.float32)
    draw_weights(model, torch.Generator().manual_seed(SEED + 100 + index))
    implementation = hc.eager_experts(model)
    model.eval()
    print(f"== {model_type}: {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, "
          f"experts implementation {implementation!r}")
    check_structure(model, spec, config)

    generator = torch.Generator().manual_seed(SEED + 200 + index)
    tokens = torch.randint(0, config.vocab_size, (NUM_TOKENS,), generator=generator).tolist()
    windows = hc.first_micro_batch_windows(NUM_TOKENS, SEQ_LENGTH, MICRO_BATCH)
    rows = [tokens[w * SEQ_LENGTH: w * SEQ_LENGTH + SEQ_LENGTH + 1] for w in windows]
    batch = torch.tensor(rows, dtype=torch.int64)
    loss, grads = hc.hf_loss_and_grads(model, batch[:, :-1], batch[:, 1:])
    weights_before = hc.our_view(model, hc.hf_parameters(model))
    grads_before = hc.our_view(model, grads)

    model.save_pretrained(directory)
    hc.write_u32(os.path.join(directory, "tokens.u32"), tokens)
    with open(os.path.join(directory, "config.json")) as f:
        config_json = json.load(f)
    listing = hc.safetensors_listing(directory)
    print(f"  save_pretrained wrote {sorted(os.listdir(directory))}")
    for name, (dtype, shape, file) in listing.items():
        print(f"    {name:<58} {dtype} {list(shape)}  ({file})")
    print("  config.json: " + json.dumps(config_json, sort_keys=True))

    # What from_pretrained makes of the directory must be the model that was saved.
    reloaded, info = hc.load_hf(directory, torch.float32)
    problems = hc.loading_problems(info)
    if problems:
        raise SystemExit(f"{model_type}: from_pretrained reports {problems}")
    weights_after = hc.our_view(reloaded, hc.hf_parameters(reloaded))
    for name, value in weights_before.items():
        if not torch.equal(value, weights_after[name]):
            raise SystemExit(f"{model_type}: {name} differs after save_pretrained/from_pretrained")
    loss_after, grads = hc.hf_loss_and_grads(reloaded, batch[:, :-1], batch[:, 1:])
    grads_after = hc.our_view(reloaded, grads)
    worst = max(hc.relative_error(grads_after[n], grads_before[n]) for n in grads_before)
    print(f"  reload: loss {loss:.9f} -> {loss_after:.9f}, largest gradient change {worst:.1e}")
    if abs(loss_after - loss) > 1e-6 * abs(loss) or worst > 1e-5:
        raise SystemExit(f"{model_type}: the reloaded model computes something else")

    grad_keys = [k for k in GRAD_KEYS if k.split("[")[0] in grads_after]
    expected = {
        "model_type": model_type,
        "architecture": type(reloaded).__name__,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "tokens": rows,
        "token_file": {"file": "tokens.u32", "num_tokens": NUM_TOKENS, "dtype": "uint32 little-endian",
                       "windows": windows, "seq_length": SEQ_LENGTH,
                       "micro_batch_size": MICRO_BATCH, "seed": hc.MOE_TRAIN_DEFAULT_SEED,
                       "validation_fraction": hc.VALIDATION_FRACTION},
        "loss": loss_after,
        "loss_definition": "mean cross-entropy of logits[:, :32] against tokens[:, 1:], "
                           "float64 from float32 logits (eager attention and experts, CPU)",
        "key_format": "NAME: our parameter; NAME[e]: expert e of a stacked (E, ...) parameter; "
                      "NAME[e][a:b]: rows a..b-1 of it (fc1[e][0:F] gate, fc1[e][F:2F] up)",
        "grads": {k: grad_entry(hc.select(grads_after, k)) for k in grad_keys},
        "grad_norms": {n: float(g.double().norm()) for n, g in sorted(grads_after.items())},
        "moe_train_flags": hc.moe_train_flags(config_json),
        "on_disk": {n: {"dtype": d, "shape": list(s)} for n, (d, s, _) in listing.items()},
        "config": config_json,
    }
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))
    print(f"  loss {loss_after:.6f}; first micro-batch = train windows {windows}; "
          f"moe_train flags {json.dumps(expected['moe_train_flags'])}; {size} bytes in {directory}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for OUT/<model_type>/")
    parser.add_argument("--models", default=",".join(SPECS), help="comma-separated model types")
    args = parser.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for index, model_type in enumerate(SPECS):
        if model_type in args.models.split(","):
            make_one(model_type, index, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
