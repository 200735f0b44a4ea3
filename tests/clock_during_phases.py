#!/usr/bin/env python3
"""SM clock, power and temperature while each moe_bench path ran its timed passes: nvidia-smi
samples (a CSV of timestamp, clocks.sm, power.draw, temperature.gpu, as
`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
-lms 50` writes it) matched against moe_bench's progress lines, each of which ends a path's
"warm-up and timed passes N s" at its glog timestamp. Both clocks are the machine's local time.

usage: clock_during_phases.py SMI.csv MOE_BENCH.log [MOE_BENCH.log ...]
"""
import datetime
import re
import sys

# glog: "I20261204 12:51:16.562068  1672 main.cc:177] mixtral 4096 fused: inputs ..., warm-up
# and timed passes 3.2 s"
PHASE = re.compile(r"I(\d{8}) (\d+:\d+:\d+\.\d+) .*\] (\w+ \d+ \w+): .*timed passes ([\d.]+) s")


def samples(path):
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            out.append((when, float(parts[1].split()[0]), float(parts[2].split()[0]),
                        float(parts[3])))
        except (ValueError, IndexError):
            continue  # a header or a cut-off last line
    return out


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    smi = samples(argv[1])
    for log in argv[2:]:
        for line in open(log):
            m = PHASE.match(line)
            if not m:
                continue
            end = datetime.datetime.strptime(m.group(1) + " " + m.group(2), "%Y%m%d %H:%M:%S.%f")
            seconds = float(m.group(4))
            begin = end - datetime.timedelta(seconds=seconds)
            window = [s for s in smi if begin <= s[0] <= end]
            if not window:
                print(f"{m.group(3)}: no samples in its {seconds:.1f} s")
                continue
            n = len(window)
            print(f"{m.group(3)}: {n} samples over {seconds:.1f} s: SM clock mean "
                  f"{sum(s[1] for s in window) / n:.0f} MHz (min {min(s[1] for s in window):.0f}), "
                  f"power mean {sum(s[2] for s in window) / n:.0f} W "
                  f"(max {max(s[2] for s in window):.0f}), {window[-1][3]:.0f} C at the end")


if __name__ == "__main__":
    main(sys.argv)
