"""What the PyTorch peer scripts in this folder share: environment parsing, CUDA timing, the FLOP
count of a MoE decoder, and the output format.

Output format (tests/gpu_benchmarks.sh and the results pages read it): each measurement is one JSON
line {"name": value}; the last line is "SUMMARY " followed by one JSON object holding them all. A
measurement that raises prints {"name": {"error": "..."}} instead, so one failing backend or
mode does not hide the others.

MFU divides by 989 TFLOP/s, the dense bf16 tensor-core peak of an H100/H200 SXM (key mfu_989).
"""
import json
import os
import time

import torch

PEAK_BF16_FLOPS = 989e12


def env_int(name, default):
    """An integer from the environment; "1e6" style values are accepted too."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def env_on(name, default=False):
    """A 0/1 switch from the environment."""
    return os.environ.get(name, "1" if default else "0") == "1"


class Report:
    """Prints measurements as JSON lines and keeps them for the closing SUMMARY line."""

    def __init__(self):
        self.results = {}

    def put(self, name, value):
        self.results[name] = value
        print(json.dumps({name: value}), flush=True)

    def measure(self, name, fn, error_chars=300):
        """put(name, fn()), or the exception's text when fn raises."""
        try:
            value = fn()
        except Exception as error:  # noqa: BLE001 - reported, the next measurement still runs
            value = dict(error=repr(error)[:error_chars])
        self.put(name, value)
        return value

    def summary(self, first=None):
        """The SUMMARY line: `first` (e.g. the shape) and then every measurement."""
        print("SUMMARY " + json.dumps({**(first or {}), **self.results}), flush=True)


def median_ms(fn, warm=3, iters=10):
    """Median of `iters` calls, each timed alone between two CUDA events (after `warm` calls)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def mean_ms(fn, warm=3, iters=20):
    """Mean of `iters` calls issued back to back between two CUDA events (after `warm` calls)."""
    for _ in range(warm):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def moe_decoder_flops(hidden, heads, kv_heads, head_dim, layers, experts, topk, ffn, vocab, seq):
    """(active parameters, training FLOPs per token) of a decoder of MoE layers, the way our
    moe_train counts them: 6 per active parameter per token (forward 2, backward 4), where the
    active parameters are the Q/K/V and output projections, the router and the top-k experts'
    three matrices in every layer, plus the LM head (the embedding is a lookup, not counted);
    plus causal attention, 12 * layers * seq * heads * head_dim for full attention, halved.
    Norm weights are left out (negligible)."""
    attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    moe = topk * 3 * hidden * ffn + hidden * experts
    active = layers * (attention + moe) + vocab * hidden
    return active, 6 * active + 6 * layers * seq * heads * head_dim


def time_training(step, warmup, steps):
    """Seconds per call of step() by wall clock, after `warmup` untimed calls (compilation, if
    any, happens there); the CUDA peak-memory counter is reset after the warm-up."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def training_figures(seconds_per_step, tokens_per_step, flops_per_token):
    """The training line's fields: ms_per_step, tokens_per_s, mfu_989, peak_GiB."""
    tokens_per_s = tokens_per_step / seconds_per_step
    return dict(ms_per_step=seconds_per_step * 1e3, tokens_per_s=tokens_per_s,
                mfu_989=tokens_per_s * flops_per_token / PEAK_BF16_FLOPS,
                peak_GiB=torch.cuda.max_memory_allocated() / 2**30)
