#!/usr/bin/python3
"""Render one step of a moe_train Chrome trace (--trace_file) as a PNG: offload overlap at a glance.

Per rank, one lane per track with events in the step (compute, offload D2H, offload H2D, pipeline
comm, data-parallel comm: the trace's thread names), x = ms from that rank's own step start (ranks
share no clock). Compute lane: schedule actions (F(m0,c0), B(m0,c0), ...) as light grey bars, the
spans inside them ("layer 3 attention forward", "layer 3 moe backward", "embedding forward", ...)
and the optimizer coloured by kind, backward hatched and paler. Copy/comm lanes have a colour
each. Below: each rank's device-memory counter (allocated MiB) on the same time axis.

Run with a python that has matplotlib (Debian: apt-get install python3-matplotlib):
  /usr/bin/python3 apps/plot_trace.py trace.json -o trace.png
  /usr/bin/python3 apps/plot_trace.py t.rank0.json t.rank1.json -o t.png --step 3 --title "pp=2"
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

KINDS = [  # compute spans: (name pattern, legend label, colour); the first match wins
    (r"attention|attn", "attention", "tab:blue"),
    (r"moe|mlp|expert|router", "MoE / MLP", "tab:green"),
    (r"embedding|head|loss", "embedding / head + loss", "tab:purple"),
    (r"optimizer", "optimizer", "tab:red"),
]
TRACKS = [  # other tracks: (thread name contains, legend label, colour)
    ("D2H", "D2H copy (offload)", "tab:orange"),
    ("H2D", "H2D copy (reload)", "tab:cyan"),
    ("pipeline", "pipeline comm", "tab:olive"),
    ("data-parallel", "data-parallel comm", "tab:brown"),
]
ACTION_COLOUR, OTHER_COLOUR = "#dddddd", "tab:gray"


def fail(message):
    sys.exit(f"plot_trace.py: {message}")


def colour_of(name, table):
    """The (label, colour) of the first entry of `table` that matches `name`."""
    return next(((label, c) for key, label, c in table if re.search(key, name)),
                (None, OTHER_COLOUR))


def is_step_span(e):  # "step N" with args {"step": N}
    return e.get("ph") == "X" and e.get("name") == f"step {e.get('args', {}).get('step')}"


def load_ranks(path):
    """One dict per process (rank) of the file: label, events, thread names and order."""
    ranks = {}
    try:
        with open(path) as f:
            for e in json.load(f)["traceEvents"]:
                r = ranks.setdefault(e.get("pid", 0), {"label": f"pid {e.get('pid', 0)}",
                                                       "events": [], "threads": {}, "order": {}})
                if e.get("ph") != "M":
                    r["events"].append(e)
                elif e["name"] == "process_name":
                    r["label"] = e["args"]["name"]
                elif e["name"] in ("thread_name", "thread_sort_index"):
                    key = "threads" if e["name"] == "thread_name" else "order"
                    r[key][e["tid"]] = next(iter(e["args"].values()))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        fail(f"{path}: not a Chrome trace ({type(e).__name__}: {e})")
    return [ranks[pid] for pid in sorted(ranks)]


def with_depth(spans):
    """Yields (depth, span): depth = how many spans of the list enclose it."""
    ends = []
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while ends and e["ts"] >= ends[-1] - 1e-3:
            ends.pop()
        yield len(ends), e
        ends.append(e["ts"] + e["dur"])


def draw_rank(ax, mem, r, root, y):
    """Draws rank `r`'s lanes from height `y` down and its memory; returns [(y, lane name)]."""
    t0, step_ms = root["ts"], root["dur"] / 1e3
    spans = [e for e in r["events"] if e.get("ph") == "X" and e is not root and
             e.get("args", {}).get("step") == root["args"]["step"]]
    lanes = []
    for tid in sorted({e["tid"] for e in spans}, key=lambda t: (r["order"].get(t, t), t)):
        track = r["threads"].get(tid, f"tid {tid}")
        lanes.append((y, f"{r['label']}  {track}"))
        for depth, e in with_depth([e for e in spans if e["tid"] == tid]):
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            if tid != root["tid"]:  # a copy or comm span
                c = colour_of(track, TRACKS)[1]
                ax.broken_barh([(x, w)], (y - 0.3, 0.6), facecolors=c, edgecolors="white", lw=0.8)
                layer = re.match(r"layer (\d+)", e["name"])
                if layer and w > step_ms / 60:
                    ax.text(x + w / 2, y, "L" + layer[1], ha="center", va="center", fontsize=8,
                            color="white", clip_on=True)
                continue
            label, colour = colour_of(e["name"], KINDS)
            if depth == 0 and label is None:  # a schedule action: label on top
                ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=ACTION_COLOUR,
                               edgecolors="gray", lw=0.5)
                ax.text(x + w / 2, y - 0.27, e["name"], ha="center", va="center", fontsize=8,
                        clip_on=True)
                continue
            backward = "backward" in e["name"]
            ax.broken_barh([(x, w)], (y - 0.15, 0.55) if depth else (y - 0.4, 0.8),
                           facecolors=colour, alpha=0.55 if backward else 0.9,
                           hatch="///" if backward else None, edgecolors="white", lw=0.5)
            layer = re.match(r"layer (\d+)", e["name"])
            if layer and w > step_ms / 60:
                ax.text(x + w / 2, y + 0.12, "L" + layer[1], ha="center", va="center",
                        fontsize=8, color="white", clip_on=True)
        y += 1
    samples = sorted((e["ts"], next(iter(e["args"].values()))) for e in r["events"]
                     if e.get("ph") == "C" and t0 <= e["ts"] <= t0 + root["dur"])
    if samples:
        mem.step([(t - t0) / 1e3 for t, _ in samples], [v for _, v in samples], where="post",
                 label=r["label"])
    return lanes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="trace file(s), one per rank under mpirun")
    p.add_argument("-o", "--output", required=True, help="PNG to write")
    p.add_argument("--step", type=int, help="step to draw (default: the first traced step)")
    p.add_argument("--title", help="figure title (default: files, step and its duration)")
    args = p.parse_args()

    ranks = [r for path in args.traces for r in load_ranks(path)]
    steps = sorted({e["args"]["step"] for r in ranks for e in r["events"] if is_step_span(e)})
    if not steps:
        fail("no traced step (no 'step N' span) in " + ", ".join(args.traces))
    step = steps[0] if args.step is None else args.step
    if step not in steps:
        fail(f"step {step} is not in the trace (traced steps: {', '.join(map(str, steps))})")

    fig, (ax, mem) = plt.subplots(2, 1, figsize=(16, 9), dpi=100, sharex=True,
                                  gridspec_kw={"height_ratios": [4, 1]})
    lanes, durations = [], []
    for r in ranks:
        root = next((e for e in r["events"] if is_step_span(e) and e["args"]["step"] == step),
                    None)
        if root is not None:  # else this rank did not trace the step
            lanes += draw_rank(ax, mem, r, root, lanes[-1][0] + 1.5 if lanes else 0)
            durations.append(root["dur"] / 1e3)

    ax.set_yticks([y for y, _ in lanes], [name for _, name in lanes])
    ax.set_ylim(lanes[-1][0] + 0.7, -0.7)  # the first rank and track on top
    ax.set_xlim(0, max(durations))
    ax.grid(axis="x", alpha=0.3)
    mem.set_xlabel("time since the step's start (ms)")
    mem.set_ylabel("device memory\nallocated (MiB)")
    mem.grid(alpha=0.3)
    if len(mem.get_lines()) > 1:
        mem.legend(fontsize=8, loc="upper right")
    names = [os.path.basename(t) for t in args.traces]
    files = ", ".join(names) if len(names) <= 2 else f"{names[0]} ... {names[-1]}"
    took = (f"{durations[0]:.1f} ms" if len(durations) == 1 else
            f"{max(durations):.1f} ms (slowest of {len(durations)} ranks)")
    fig.suptitle(args.title or f"{files}: step {step}, {took}", fontsize=13)
    handles = ([Patch(facecolor=ACTION_COLOUR, edgecolor="gray", label="schedule action")] +
               [Patch(facecolor=c, label=label) for _, label, c in KINDS] +
               [Patch(facecolor="white", edgecolor="black", hatch="///", label="backward")] +
               [Patch(facecolor=c, label=label) for _, label, c in TRACKS])
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=9,
               bbox_to_anchor=(0.5, 0.955), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    try:
        fig.savefig(args.output)
    except OSError as e:
        fail(f"{args.output}: {e.strerror}")
    print(f"wrote {args.output} (step {step})")


if __name__ == "__main__":
    main()
