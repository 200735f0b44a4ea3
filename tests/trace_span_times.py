#!/usr/bin/env python3
"""Milliseconds per step of each kind of compute span in moe_train traces (--trace_file), one
column per file: builds or settings side by side. Layer, micro-batch and chunk numbers are dropped
from the names ("layer 3 attention forward" -> "attention forward", "forward m2 c0" ->
"forward"); a span's time is its device time, so the forward and backward actions include any
wait on the host inside them. Two "(edge)" rows give the time from each step's start to its
first forward and from its optimizer's end to the step's end (where the device can only wait for
the host: the breakdown's "other"). Spans inside others are rows of their own and also count in
their parents' ("moe weight gradients" in "moe backward", "fp8 weight quantisation" in "moe
forward").

usage: trace_span_times.py TRACE.json [TRACE.json ...]
"""
import collections
import json
import re
import sys

STEP = re.compile(r"step \d+")


def kind(name):
    return re.sub(r" m\d+ c\d+$", "", re.sub(r"^layer \d+ ", "", name))


def span_times(path):
    """(ms per step of each span kind, ms per step) of one trace file."""
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if STEP.fullmatch(e.get("name", ""))]
    if not steps:
        sys.exit(f"{path}: no step spans")
    sums = collections.Counter()
    for e in spans:
        if not STEP.fullmatch(e["name"]):
            sums[kind(e["name"])] += e.get("dur", 0) / 1e3
    # The step's edges, where the device waits for the host ("other" in the breakdown): from the
    # step's start to its first forward, and from the optimizer's end to the step's end.
    for step in steps:
        begin, end = step["ts"], step["ts"] + step["dur"]
        inside = [e for e in spans if begin <= e["ts"] <= end and e is not step]
        forwards = [e["ts"] for e in inside if e["name"].startswith("forward")]
        optimizers = [e["ts"] + e["dur"] for e in inside if e["name"].startswith("optimizer")]
        if forwards:
            sums["(edge) step start to first forward"] += (min(forwards) - begin) / 1e3
        if optimizers:
            sums["(edge) optimizer end to step end"] += (end - max(optimizers)) / 1e3
    n = len(steps)
    return {k: v / n for k, v in sums.items()}, sum(e["dur"] for e in steps) / 1e3 / n


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    columns = [(path, *span_times(path)) for path in sys.argv[1:]]
    first = columns[0][1]
    kinds = sorted({k for _, sums, _ in columns for k in sums}, key=lambda k: -first.get(k, 0))
    print(f"{'ms per step':44s}" + "".join(f"{path.split('/')[-1][-18:]:>19s}"
                                           for path, _, _ in columns))
    for k in kinds:
        print(f"{k[:44]:44s}" + "".join(f"{sums.get(k, 0):19.2f}" for _, sums, _ in columns))
    print(f"{'step':44s}" + "".join(f"{step:19.2f}" for _, _, step in columns))


if __name__ == "__main__":
    main()
