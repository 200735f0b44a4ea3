"""PyTorch peer of moe_train, end to end on one GPU: a decoder of MoE layers written in plain
PyTorch and trained in eager mode (or through torch.compile with COMPILE=1), bf16, random tokens.

The model: token embedding; per layer RMSNorm -> attention (one Q/K/V projection, optional
per-head RMSNorm of queries and keys (Qwen3's), rotary embedding (rotate-half), causal GQA through
scaled_dot_product_attention, output projection) -> residual -> RMSNorm -> MoE (linear router,
softmax, top-k renormalised to sum 1, rows sorted by expert and counted per expert on the device,
fc1 (gate and up) -> SwiGLU, scaled by the routing weight -> fc2 as torch._grouped_mm calls,
scatter-add back; no host sync in the layer) -> residual, with the switch-transformer
load-balancing loss (weight 1e-2); final RMSNorm, untied LM head, cross-entropy.
Training: ACCUM micro-batches of MBS x SEQ tokens, each with its backward, then one fused AdamW
step. Precision: bf16 parameters, gradients and AdamW moments, no fp32 master weights, so its
optimizer step moves about half the bytes of a trainer that keeps fp32 master weights.

Timed: wall clock over STEPS steps after WARMUP untimed ones (compilation happens there), peak
memory from torch.cuda.max_memory_allocated over the timed steps. With OFFLOAD=1 the same is run
again with every saved activation under torch.autograd.graph.save_on_cpu(pin_memory=True).
FLOPs per token, as moe_train counts them (peer_timing.moe_decoder_flops): 6 x active parameters
(attention projections, router, top-k experts per layer, LM head; not the embedding) + causal
attention 6 x LAYERS x SEQ x HEADS x HEAD_DIM; MFU against 989 TFLOP/s.

Environment (defaults: configs/qwen3_moe_8layer.flags' model):
  LAYERS 8, HIDDEN 2048, HEADS 16, KV 4 (key/value heads), HEAD_DIM (HIDDEN / HEADS), EXPERTS 128,
  TOPK 8, FFN 768 (expert width), VOCAB 32000, SEQ 4096, MBS 1 (micro-batch), ACCUM 1 (micro-batches
  per step), ROPE_BASE 10000, QK_NORM 0, COMPILE 0, OFFLOAD 1 (0: skip the save_on_cpu run),
  WARMUP 3, STEPS 10.
  The real Qwen3-30B-A3B layer: HEADS=32 KV=4 HEAD_DIM=128 QK_NORM=1 ROPE_BASE=1000000 VOCAB=151936.
Prints a JSON header (cfg, compile, torch, total_params, active_params, flops_per_token), one line
per run ({"offload_False": {ms_per_step, tokens_per_s, mfu_989, peak_GiB}}), then
SUMMARY {"offload_False": ..., "offload_True": ...}."""
import dataclasses
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from peer_timing import (Report, env_int, env_on, moe_decoder_flops, time_training,
                         training_figures)


@dataclasses.dataclass
class Shape:
    vocab: int
    hidden: int
    heads: int
    kv: int
    layers: int
    experts: int
    topk: int
    ffn: int
    seq: int
    mbs: int
    accum: int
    qk_norm: int
    rope_base: int
    head_dim: int

    @classmethod
    def from_env(cls):
        hidden, heads = env_int("HIDDEN", 2048), env_int("HEADS", 16)
        return cls(vocab=env_int("VOCAB", 32000), hidden=hidden, heads=heads, kv=env_int("KV", 4),
                   layers=env_int("LAYERS", 8), experts=env_int("EXPERTS", 128),
                   topk=env_int("TOPK", 8), ffn=env_int("FFN", 768), seq=env_int("SEQ", 4096),
                   mbs=env_int("MBS", 1), accum=env_int("ACCUM", 1),
                   qk_norm=env_int("QK_NORM", 0), rope_base=env_int("ROPE_BASE", 10000),
                   head_dim=env_int("HEAD_DIM", hidden // heads))

    def flops(self):
        return moe_decoder_flops(self.hidden, self.heads, self.kv, self.head_dim, self.layers,
                                 self.experts, self.topk, self.ffn, self.vocab, self.seq)


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        inv_rms = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps)
        return self.weight * (x * inv_rms.to(x.dtype))


def rotate(x, cos, sin):
    """Rotary embedding on (batch, heads, seq, dim): pairs (i, i + dim/2)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.heads, self.kv, self.dim = s.heads, s.kv, s.head_dim
        self.qkv = nn.Linear(s.hidden, (s.heads + 2 * s.kv) * s.head_dim, bias=False)
        self.proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        norm = (lambda: RMSNorm(s.head_dim)) if s.qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        heads = self.qkv(x).view(batch, seq, self.heads + 2 * self.kv, self.dim)
        q, k, v = heads.split((self.heads, self.kv, self.kv), dim=2)
        q = rotate(self.q_norm(q).transpose(1, 2), cos, sin)
        k = rotate(self.k_norm(k).transpose(1, 2), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, -1))


class MoE(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.experts, self.topk = s.experts, s.topk
        self.router = nn.Linear(s.hidden, s.experts, bias=False)
        self.fc1 = nn.Parameter(0.02 * torch.randn(s.experts, s.hidden, 2 * s.ffn))  # gate | up
        self.fc2 = nn.Parameter(0.02 * torch.randn(s.experts, s.ffn, s.hidden))

    def forward(self, x):
        tokens = x.flatten(0, 1)
        probs = self.router(tokens).float().softmax(-1)
        weight, chosen = probs.topk(self.topk, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        chosen = chosen.flatten()
        order = chosen.argsort(stable=True)  # routed rows grouped by expert
        source = order // self.topk  # each routed row's token
        # Rows per expert without a host sync (torch.bincount on CUDA reads its maximum back).
        per_expert = chosen.new_zeros(self.experts).index_add_(0, chosen, torch.ones_like(chosen))
        offsets = per_expert.cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(tokens[source], self.fc1, offs=offsets).chunk(2, dim=-1)
        hidden = F.silu(gate) * up * weight.flatten()[order, None].to(x.dtype)
        rows = torch._grouped_mm(hidden, self.fc2, offs=offsets)
        out = torch.zeros_like(tokens).index_add_(0, source, rows)
        balance = self.experts * (per_expert.float() / chosen.numel() * probs.mean(0)).sum()
        return out.view_as(x), balance


class Layer(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(s.hidden), Attention(s)
        self.moe_norm, self.moe = RMSNorm(s.hidden), MoE(s)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        y, balance = self.moe(self.moe_norm(x))
        return x + y, balance


class Decoder(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden)
        self.head = nn.Linear(s.hidden, s.vocab, bias=False)
        half = s.head_dim // 2
        freq = s.rope_base ** -(torch.arange(half, dtype=torch.float32) / half)
        angle = torch.arange(s.seq, dtype=torch.float32)[:, None] * freq
        self.register_buffer("cos", angle.cos().to(torch.bfloat16), persistent=False)
        self.register_buffer("sin", angle.sin().to(torch.bfloat16), persistent=False)

    def forward(self, ids, targets):
        x, balance = self.embed(ids), 0.0
        for layer in self.layers:
            x, layer_balance = layer(x, self.cos, self.sin)
            balance = balance + layer_balance
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten()) + 1e-2 * balance


def main():
    s = Shape.from_env()
    compile_model = env_on("COMPILE")
    torch.manual_seed(0)
    # Built on the GPU in bf16 directly (a CPU float32 build of ~5B parameters takes long).
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Decoder(s)
    torch.set_default_dtype(torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    run = torch.compile(model) if compile_model else model
    active, flops_per_token = s.flops()
    print(json.dumps(dict(cfg=dataclasses.asdict(s), compile=compile_model,
                          torch=torch.__version__,
                          total_params=sum(p.numel() for p in model.parameters()),
                          active_params=active, flops_per_token=flops_per_token)), flush=True)

    def step(offload):
        for _ in range(s.accum):
            ids, targets = (torch.randint(0, s.vocab, (s.mbs, s.seq), device="cuda")
                            for _ in range(2))
            with (torch.autograd.graph.save_on_cpu(pin_memory=True) if offload
                  else torch.enable_grad()):
                loss = run(ids, targets)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    report = Report()
    warmup, steps = env_int("WARMUP", 3), env_int("STEPS", 10)
    for offload in (False, True) if env_on("OFFLOAD", default=True) else (False,):
        report.measure(f"offload_{offload}", lambda: training_figures(
            time_training(lambda: step(offload), warmup, steps), s.accum * s.mbs * s.seq,
            flops_per_token))
    report.summary()


if __name__ == "__main__":
    main()
