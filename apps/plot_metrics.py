#!/usr/bin/python3
"""Plot moe_train's loss curves from --metrics_file JSON lines as a PNG: training loss per logged
step (and validation loss where evaluated) of each run, labelled by its file name or --labels; a
lower panel shows each run's difference from the first run's loss at the same steps.

Run with a python that has matplotlib (Debian: apt-get install python3-matplotlib):
  /usr/bin/python3 apps/plot_metrics.py f32.jsonl bf16.jsonl -o curves.png --labels "f32,bf16"
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_curves(path):
    train, evals = {}, {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if "val_loss" in record:
                evals[record["step"]] = record["val_loss"]
            elif "loss" in record:
                train[record["step"]] = record["loss"]
    return train, evals


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--labels", help="comma-separated, one per file")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.basename(f) for f in args.files]
    if len(labels) != len(args.files):
        parser.error("--labels needs one label per file")
    runs = [read_curves(f) for f in args.files]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    base_train = runs[0][0]
    for (train, evals), label in zip(runs, labels):
        steps = sorted(train)
        line, = top.plot(steps, [train[s] for s in steps], label=f"{label} (train)")
        if evals:
            e = sorted(evals)
            top.plot(e, [evals[s] for s in e], "o", color=line.get_color(),
                     label=f"{label} (validation)")
        shared = [s for s in steps if s in base_train]
        bottom.plot(shared, [train[s] - base_train[s] for s in shared], color=line.get_color())
    top.set_ylabel("loss (nats/token)")
    top.set_title(args.title)
    top.legend()
    top.grid(alpha=0.3)
    bottom.set_ylabel(f"minus {labels[0]}")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
