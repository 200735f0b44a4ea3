"""PyTorch peer of moe_bench: one MoE block's expert computation on one GPU, bf16, at the
Qwen3-30B-A3B layer shape by default, plus the two device anchors the block figures are read
against.

What is timed (no router: the routing is fixed, softmax over Gaussian logits, top-k, rows sorted by
expert):
  copy anchors   pinned host <-> device copies of 1 GiB: d2h_GBps, h2d_GBps, and both directions
                 at once on two streams (bidir_GBps_total, bytes of both copies);
  GEMM anchor    one 8192^3 bf16 matmul (gemm_bf16_TFLOPs);
  the block      gather the routed rows, fc1 (gate and up) -> SwiGLU -> fc2 per expert, weight
                 each row by its routing probability and scatter-add it back to its token, a
                 mean-square loss and its backward (input and both weight gradients). Two ways
                 to run the expert MLP: fused_grouped_mm (torch._grouped_mm over the expert
                 offsets, no host sync) and unfused_loop (one matmul pair per expert, host
                 counts). fwd_ms is gather + MLP; fwdbwd_ms the whole block with its backward.
                 Weight gradients accumulate across iterations (tests/reference/
                 torch_moe_block_grads.py times fresh ones too). rel_err_vs_loop checks the
                 fused forward against the loop.
  save_on_cpu    four fused MLPs stacked with residuals, forward + backward, without and with
                 torch.autograd.graph.save_on_cpu(pin_memory=True): time and peak memory above
                 what was allocated before (stack4_saveoncpu_False / _True).
FLOPs: the forward counts the two grouped GEMMs, 2*rows*H*2F + 2*rows*F*H with rows = tokens*topk;
forward + backward counts three times that. Each figure is the median of ITERS CUDA-event timings.

Environment: T tokens (4096), HIDDEN (2048), EXPERTS (128), TOPK (8), FFN expert width (768),
ITERS (10; the save_on_cpu stack runs half as many), ANCHORS=0 skips the copy and GEMM anchors.
Prints one JSON line per measurement (moe_shape first among the block's), then SUMMARY {...}.
Run: python3 tests/peers/torch_moe_block_peer.py (CUDA and torch >= 2.8 for torch._grouped_mm)."""
import types

import torch
import torch.nn.functional as F

from peer_timing import Report, env_int, env_on, median_ms


def make_block(tokens, hidden, experts, topk, ffn, device="cuda", seed=0):
    """Inputs, fixed routing sorted by expert, and expert weights of one MoE block (bf16).
    Seeded here, so the routing does not depend on what ran before."""
    torch.manual_seed(seed)
    b = types.SimpleNamespace(tokens=tokens, hidden=hidden, experts=experts, topk=topk, ffn=ffn)
    b.x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    logits = torch.randn(tokens, experts, device=device)
    probs, chosen = logits.softmax(-1).topk(topk, dim=-1)
    chosen = chosen.flatten()
    b.order = chosen.argsort(stable=True)  # routed row -> (token, slot), grouped by expert
    b.source = b.order // topk  # routed row -> token
    b.row_weight = probs.flatten()[b.order, None].to(torch.bfloat16)
    b.counts = torch.bincount(chosen, minlength=experts)
    b.offsets = b.counts.cumsum(0).to(torch.int32)  # end row of each expert
    b.host_counts = b.counts.tolist()
    b.fc1 = (0.02 * torch.randn(experts, hidden, 2 * ffn, device=device, dtype=torch.bfloat16)
             ).requires_grad_()
    b.fc2 = (0.02 * torch.randn(experts, ffn, hidden, device=device, dtype=torch.bfloat16)
             ).requires_grad_()
    b.rows = tokens * topk
    b.fwd_flop = 2 * b.rows * hidden * 2 * ffn + 2 * b.rows * ffn * hidden
    return b


def swiglu(h):
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def grouped_mlp(b, rows):
    """The experts' MLP over rows sorted by expert, two torch._grouped_mm calls."""
    return torch._grouped_mm(swiglu(torch._grouped_mm(rows, b.fc1, offs=b.offsets)), b.fc2,
                             offs=b.offsets)


def looped_mlp(b, rows):
    """The same MLP as one matmul pair per expert, slicing rows by the host's counts."""
    outputs, begin = [], 0
    for e, n in enumerate(b.host_counts):
        outputs.append(swiglu(rows[begin:begin + n] @ b.fc1[e]) @ b.fc2[e])
        begin += n
    return torch.cat(outputs)


def block_step(b, mlp, fresh_grads=False):
    """Gather, MLP, weighted scatter-add, mean-square loss, backward."""
    if fresh_grads:
        b.fc1.grad = b.fc2.grad = None
    rows = b.x[b.source].requires_grad_()
    out = torch.zeros_like(b.x).index_add_(0, b.source, mlp(b, rows) * b.row_weight)
    out.float().square().mean().backward()


def copy_anchors(report, iters):
    n = 1 << 30
    host = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    dev = [torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255) for _ in range(2)]
    report.put("d2h_GBps", n / median_ms(lambda: host[0].copy_(dev[0], non_blocking=True),
                                         iters=iters) / 1e6)
    report.put("h2d_GBps", n / median_ms(lambda: dev[0].copy_(host[0], non_blocking=True),
                                         iters=iters) / 1e6)
    streams = torch.cuda.Stream(), torch.cuda.Stream()

    def both_ways():
        main = torch.cuda.current_stream()
        for s in streams:
            s.wait_stream(main)
        with torch.cuda.stream(streams[0]):
            host[0].copy_(dev[0], non_blocking=True)
        with torch.cuda.stream(streams[1]):
            dev[1].copy_(host[1], non_blocking=True)
        for s in streams:
            main.wait_stream(s)

    report.put("bidir_GBps_total", 2 * n / median_ms(both_ways, iters=iters) / 1e6)


def gemm_anchor(report, iters):
    a, c = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    report.put("gemm_bf16_TFLOPs", 2 * 8192**3 / median_ms(lambda: a @ c, iters=iters) / 1e9)


def block_paths(report, b, iters):
    report.put("moe_shape", dict(T=b.tokens, H=b.hidden, E=b.experts, topk=b.topk, ffn=b.ffn,
                                 rows=b.rows, fwd_gflop=b.fwd_flop / 1e9))
    for name, mlp in (("fused_grouped_mm", grouped_mlp), ("unfused_loop", looped_mlp)):
        def measure(mlp=mlp):
            with torch.no_grad():
                rows = b.x[b.source]
                want, got = looped_mlp(b, rows).float(), mlp(b, rows).float()
                err = ((got - want).norm() / want.norm()).item()
            fwd = median_ms(lambda: mlp(b, b.x[b.source]).sum(), iters=iters)
            fwdbwd = median_ms(lambda: block_step(b, mlp), iters=iters)
            return dict(fwd_ms=fwd, fwd_TFLOPs=b.fwd_flop / fwd / 1e9, fwdbwd_ms=fwdbwd,
                        fwdbwd_TFLOPs=3 * b.fwd_flop / fwdbwd / 1e9, rel_err_vs_loop=err)
        report.measure(name, measure)


def save_on_cpu_stack(report, b, iters, depth=4):
    def stack(offload):
        h = b.x[b.source].requires_grad_()
        with (torch.autograd.graph.save_on_cpu(pin_memory=True) if offload
              else torch.enable_grad()):
            for _ in range(depth):
                h = h + grouped_mlp(b, h)
        h.float().square().mean().backward()

    for offload in (False, True):
        def measure(offload=offload):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            ms = median_ms(lambda: stack(offload), warm=2, iters=iters)
            return dict(fwdbwd_ms=ms, peak_MiB=(torch.cuda.max_memory_allocated() - before) / 2**20)
        report.measure(f"stack{depth}_saveoncpu_{offload}", measure)


def main():
    report, iters = Report(), env_int("ITERS", 10)
    if env_on("ANCHORS", default=True):
        copy_anchors(report, iters)
        gemm_anchor(report, iters)
    b = make_block(env_int("T", 4096), env_int("HIDDEN", 2048), env_int("EXPERTS", 128),
                   env_int("TOPK", 8), env_int("FFN", 768))
    block_paths(report, b, iters)
    save_on_cpu_stack(report, b, max(iters // 2, 1))
    report.summary()


if __name__ == "__main__":
    main()
