#!/usr/bin/env python3
"""Timing-only variants of the unclustered FP8 weight-gradient kernel, each leaving one stage of
its work out, so that the time a stage costs is the difference against the whole kernel (no
counters needed).
Their results are wrong (the FP8 probe's checks fail; its timings stand):
  no_promote  the consumers issue and wait for each stage's wgmmas but do not scale them into acc
  no_write    acc is computed but not written (no staging, no TMA stores)
  none        both left out
Each variant is a copy of the work tree's kernels and probes (engine/kernels, engine/core,
tests/kernels: what the whole kernel's probe is built from; no git needed) with the kernel edited;
an edit whose anchor is not found once stops the script.

usage: tests/fp8_wgrad_leave_out.py OUTDIR   (from the repository root; prints the variants)
"""
import os
import shutil
import sys

KERNEL = "engine/kernels/cuda/grouped_gemm/sm90/fp8_weight_grad_kernel.cuh"
SOURCES = ["engine/kernels", "engine/core", "tests/kernels"]
PROMOTION = "if (active) PromoteFp8WeightGradStage("
EDITS = {
    "no_promote": [(PROMOTION, "if (false) PromoteFp8WeightGradStage(")],
    "no_write": [("    WriteTile<Out, kFp8WeightGradStagingBytes>(",
                  "    FenceAccumulators(acc);  // acc stays computed\n"
                  "    if (false) WriteTile<Out, kFp8WeightGradStagingBytes>(")],
}
EDITS["none"] = EDITS["no_promote"] + EDITS["no_write"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    source = open(KERNEL).read()
    for name, edits in EDITS.items():
        text = source
        for old, new in edits:
            if text.count(old) != 1:
                sys.exit(f"{KERNEL}: the anchor of {name} is not there once: {old[:60]!r}")
            text = text.replace(old, new)
        tree = os.path.join(out, name)
        shutil.rmtree(tree, ignore_errors=True)
        for folder in SOURCES:
            shutil.copytree(folder, os.path.join(tree, folder))
        with open(os.path.join(tree, KERNEL), "w") as f:
            f.write(text)
        print(name)


if __name__ == "__main__":
    main()
