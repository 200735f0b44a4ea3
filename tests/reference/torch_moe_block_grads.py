"""The PyTorch grouped-MLP block of tests/peers/torch_moe_block_peer.py (torch._grouped_mm, Qwen3-30B-A3B
shape, 4096 tokens, the same routing recipe), forward + backward timed two ways, to compare like
with like against moe_bench's two columns:
  accumulating: the weight gradients add to those of the previous iteration (what the peer times;
                moe_bench's "+= grads" column);
  fresh:        the gradients are set to None before each iteration (a step's first micro-batch:
                autograd stores them; moe_bench's "fwd+bwd" column).
Prints one JSON line. Run on the GPU machine: python3 tests/reference/torch_moe_block_grads.py"""
import json

import torch
import torch.nn.functional as F

dev = torch.device("cuda")
torch.manual_seed(0)
T, H, E, K, FFN = 4096, 2048, 128, 8, 768
x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
probs, idx = torch.topk(torch.randn(T, E, device=dev).softmax(-1), K, dim=-1)
order = torch.argsort(idx.flatten(), stable=True)
offs = torch.cumsum(torch.bincount(idx.flatten(), minlength=E), 0).to(torch.int32)
tok = order // K
w1 = (torch.randn(E, H, 2 * FFN, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
w2 = (torch.randn(E, FFN, H, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()


def block(fresh):
    if fresh:
        w1.grad = w2.grad = None
    xp = x[tok].requires_grad_()
    gate, up = torch._grouped_mm(xp, w1, offs=offs).chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, w2, offs=offs)
    y = torch.zeros_like(x).index_add_(0, tok, out * probs.flatten()[order, None].to(out.dtype))
    y.float().square().mean().backward()


def median_ms(fn, warm=3, iters=10):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


print(json.dumps({"torch_block_fwdbwd_ms": {"accumulating": median_ms(lambda: block(False)),
                                            "fresh": median_ms(lambda: block(True))}}))
