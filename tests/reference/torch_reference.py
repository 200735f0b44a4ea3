#!/usr/bin/env python3
"""PyTorch reference of moe_train's model.

Reads DIR/reference.safetensors and DIR/config.json, written by
`moe_train --dump_reference_case=DIR` (weights, one micro-batch, our loss and gradients),
rebuilds the same model from its definition in float64, recomputes loss = mean cross-entropy +
MoE aux losses and every parameter gradient, and compares them with ours by relative error
||ours - reference|| / ||reference||. Exits non-zero if any exceeds --tolerance.

The model options config.json names: the head dimension kv_channels; qk_layernorm, an RMSNorm of
the queries and keys before RoPE, Qwen3's (one weight of head_dim applied to each head) or with
qk_layernorm_across_heads OLMoE's (one weight over each token's whole query projection, one over
its keys); rotary_base; norm_epsilon; moe_router_pre_softmax, gate weights that are the softmax's
top-k probabilities as they are (else renormalised to sum 1).

usage: torch_reference.py DIR --tolerance 1e-3
"""
import argparse
import json
import math
import sys

import torch
from safetensors.torch import load_file


def rms_norm(x, weight, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rope(x, seq, base):
    """x (tokens, heads, d); rotate-half pairs (i, i + d/2) by pos * base^(-2i/d)."""
    tokens, _, d = x.shape
    half = d // 2
    pos = torch.arange(tokens, dtype=x.dtype) % seq
    inv_freq = base ** (-2.0 * torch.arange(half, dtype=x.dtype) / d)
    angle = pos[:, None] * inv_freq[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def query_or_key(x, p, name, heads, cfg):
    """The query or key heads (tokens, heads, d) of projection `name` (q or k): normalised when
    the model has the query/key norm (over each head, or over the token's whole projection
    across heads), then rotated."""
    tokens, d = x.shape[0], cfg["kv_channels"]
    y = x @ p[f"{name}_proj.weight"].T
    if cfg["qk_layernorm"] and cfg["qk_layernorm_across_heads"]:
        y = rms_norm(y, p[f"{name}_norm.weight"], cfg["norm_epsilon"])
    y = y.view(tokens, heads, d)
    if cfg["qk_layernorm"] and not cfg["qk_layernorm_across_heads"]:
        y = rms_norm(y, p[f"{name}_norm.weight"], cfg["norm_epsilon"])
    return rope(y, cfg["seq_length"], cfg["rotary_base"])


def attention(x, p, name, cfg):
    tokens, seq = x.shape[0], cfg["seq_length"]
    batch = tokens // seq
    heads, groups = cfg["num_attention_heads"], cfg["num_query_groups"]
    d = cfg["kv_channels"]
    q = query_or_key(x, p, name + ".q", heads, cfg)
    k = query_or_key(x, p, name + ".k", groups, cfg)
    v = (x @ p[name + ".v_proj.weight"].T).view(tokens, groups, d)
    q = q.view(batch, seq, heads, d).transpose(1, 2)
    k = k.view(batch, seq, groups, d).transpose(1, 2).repeat_interleave(heads // groups, dim=1)
    v = v.view(batch, seq, groups, d).transpose(1, 2).repeat_interleave(heads // groups, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    out = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
    out = out.transpose(1, 2).reshape(tokens, heads * d)
    return out @ p[name + ".o_proj.weight"].T


def swiglu(h):
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def dense_mlp(x, p, name):
    return swiglu(x @ p[name + ".fc1.weight"].T) @ p[name + ".fc2.weight"].T


def moe(x, p, name, cfg):
    tokens, experts, k = x.shape[0], cfg["num_experts"], cfg["moe_router_topk"]
    logits = x @ p[name + ".router.weight"].T
    probs = logits.softmax(-1)
    values, chosen = probs.topk(k, dim=-1)
    weights = values if cfg["moe_router_pre_softmax"] else values / values.sum(-1, keepdim=True)
    counts = torch.bincount(chosen.flatten(), minlength=experts).to(x.dtype)
    aux = cfg["moe_aux_loss_coeff"] * experts / (tokens * tokens * k) * (counts * probs.sum(0)).sum()
    if cfg["moe_z_loss_coeff"] != 0:
        aux = aux + cfg["moe_z_loss_coeff"] * (torch.logsumexp(logits, -1) ** 2).mean()
    fc1, fc2 = p[name + ".experts.fc1.weight"], p[name + ".experts.fc2.weight"]
    y = torch.zeros_like(x)
    for e in range(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        a = swiglu(x[token] @ fc1[e].T) * weights[token, slot][:, None]
        y = y.index_add(0, token, a @ fc2[e].T)
    return y, aux


def model_loss(p, ids, targets, cfg):
    eps = cfg["norm_epsilon"]
    x = p["embedding.weight"][ids]
    aux_total = torch.zeros((), dtype=x.dtype)
    for layer in range(cfg["num_layers"]):
        prefix = f"layers.{layer}"
        h = x + attention(rms_norm(x, p[prefix + ".attn_norm.weight"], eps), p, prefix + ".attention", cfg)
        normed = rms_norm(h, p[prefix + ".mlp_norm.weight"], eps)
        if layer < cfg["first_dense_layers"]:
            m = dense_mlp(normed, p, prefix + ".mlp")
        else:
            m, aux = moe(normed, p, prefix + ".moe", cfg)
            aux_total = aux_total + aux
        x = h + m
    logits = rms_norm(x, p["final_norm.weight"], eps) @ p["lm_head.weight"].T
    ce = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-1, reduction="sum")
    return ce / ids.numel(), aux_total


def relative_error(ours, reference):
    ours, reference = ours.double().flatten(), reference.double().flatten()
    if not torch.isfinite(ours).all():
        return math.inf
    return ((ours - reference).norm() / reference.norm().clamp_min(1e-30)).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--tolerance", type=float, required=True)
    args = parser.parse_args()
    cfg = json.load(open(f"{args.dir}/config.json"))
    dump = load_file(f"{args.dir}/reference.safetensors")
    ids, targets = dump["ids"].long(), dump["targets"].long()
    params = {name: tensor.double().requires_grad_() for name, tensor in dump.items()
              if name.endswith(".weight") and not name.startswith("grad.")}
    ce, aux = model_loss(params, ids, targets, cfg)
    (ce + aux).backward()

    rows = [("loss", relative_error(dump["loss"], ce.detach().reshape(1))),
            ("aux_loss", relative_error(dump["aux_loss"], aux.detach().reshape(1)))]
    rows += [(name, relative_error(dump["grad." + name], p.grad)) for name, p in sorted(params.items())]
    worst = max(error for _, error in rows)
    print(f"reference: {len(params)} parameters, loss ours {dump['loss'].item():.6f} "
          f"torch {ce.item():.6f}, aux ours {dump['aux_loss'].item():.6f} torch {aux.item():.6f}")
    for name, error in rows:
        print(f"  {name:<48} {error:.2e}{'  FAIL' if not error <= args.tolerance else ''}")
    print(f"largest relative error {worst:.2e} (tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
