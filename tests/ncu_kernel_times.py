#!/usr/bin/env python3
"""Sums the kernel durations of an `ncu --metrics gpu__time_duration.sum --csv` capture by kernel
name, largest first: where a benchmark's GPU time goes.

usage: ncu_kernel_times.py CAPTURE.csv [name width]
"""
import collections
import csv
import signal
import sys


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 90
    rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
    if not rows:
        sys.exit(f"{sys.argv[1]}: no ncu CSV rows")
    header = rows[0]
    name, value = header.index("Kernel Name"), header.index("Metric Value")
    times = collections.defaultdict(list)
    for r in rows[1:]:
        times[r[name][:width]].append(float(r[value].replace(",", "")) / 1e3)  # ns -> us
    total = sum(sum(v) for v in times.values())
    print(f"{len(rows) - 1} kernels, {total:.1f} us in all")
    for kernel, us in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(us):9.1f} us {100 * sum(us) / total:5.1f}%  n={len(us):4d}  "
              f"median {sorted(us)[len(us) // 2]:8.1f}  {kernel}")


if __name__ == "__main__":
    main()
