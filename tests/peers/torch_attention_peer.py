"""PyTorch peer of attention_bench: causal grouped-query attention through
torch.nn.functional.scaled_dot_product_attention, bf16, one GPU, once per SDPA backend:
flash (PyTorch's FlashAttention-2, with enable_gqa), cudnn and efficient (memory-efficient); the
last two are given K and V expanded to every query head, and that expansion is inside the timing.

Timed: forward, and forward + backward (torch.autograd.grad of Q, K, V against a fixed output
gradient), each the mean of ITERS calls issued back to back after 3 warm-up calls.
FLOPs count the causal half of QK^T and PV: forward 2 * 2 * B * H * T * T * D / 2; the backward
counts 2.5 times the forward, so forward + backward is 3.5 times it. Our attention_bench counts
the same.

Environment: B batch (1), H query heads (16), KV heads (4), T sequence (4096), D head dim (128),
ITERS (20); the defaults are configs/qwen3_moe_8layer.flags' attention.
Prints one JSON line per backend ({"flash": {fwd_ms, fwd_TFLOPs, fwdbwd_ms, fwdbwd_TFLOPs}} or
{"...": {"error": ...}} where the backend refuses the shape), then
SUMMARY {"shape": {b, h, kv, t, d}, "flash": ..., "cudnn": ..., "efficient": ...}.
Run: B=1 H=16 KV=4 T=4096 D=128 python3 tests/peers/torch_attention_peer.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import Report, env_int, mean_ms

BACKENDS = (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION))


def main():
    shape = {k: env_int(k.upper(), v) for k, v in
             (("b", 1), ("h", 16), ("kv", 4), ("t", 4096), ("d", 128))}
    b, h, kv, t, d = shape.values()
    iters = env_int("ITERS", 20)
    torch.manual_seed(0)

    def tensor(heads, grad=True):
        return torch.randn(b, heads, t, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=grad)

    q, k, v, out_grad = tensor(h), tensor(kv), tensor(kv), tensor(h, grad=False)
    fwd_flop = 2 * 2 * b * h * t * t * d / 2
    report = Report()
    for name, backend in BACKENDS:
        native_gqa = name == "flash"

        def attend():
            if native_gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            keys, values = (x.repeat_interleave(h // kv, dim=1) for x in (k, v))
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True)

        def measure():
            with sdpa_kernel(backend):
                fwd = mean_ms(attend, iters=iters)
                fwdbwd = mean_ms(lambda: torch.autograd.grad(attend(), (q, k, v), out_grad),
                                 iters=iters)
            return dict(fwd_ms=fwd, fwd_TFLOPs=fwd_flop / fwd / 1e9, fwdbwd_ms=fwdbwd,
                        fwdbwd_TFLOPs=3.5 * fwd_flop / fwdbwd / 1e9)

        report.measure(name, measure, error_chars=200)
    report.summary(first=dict(shape=shape))


if __name__ == "__main__":
    main()
