#!/usr/bin/env python3
"""Two (or more) kernels_bench binaries in turn, each layer's least time kept (issue 21).

On a shared VM whose speed changes for seconds at a time, one run of each binary says little; this
runs them alternately ROUNDS times and compares every layer's minimum (and prints the medians,
whose spread shows the noise). Build the binaries from two header trees, e.g.
  git archive <commit> kernels | tar -x -C /tmp/old
  g++ -O3 -std=c++20 -fno-math-errno -DNDEBUG -march=native -I/tmp/old -I. bench/kernels_bench.cpp -o kb_old -pthread
  g++ -O3 -std=c++20 -fno-math-errno -DNDEBUG -march=native -I. bench/kernels_bench.cpp -o kb_new -pthread
  python3 bench/ab_kernels_bench.py 12 conv ./kb_old ./kb_new
Prints per layer: min/median ms of each binary and min(second)/min(first); then the geomean of
that ratio over the layers.
"""
import collections
import math
import re
import subprocess
import sys


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    rounds, only, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for _ in range(rounds):
        for b in bins:
            out = subprocess.run([b, "--threads", "1", "--reps", "5", "--only", only, "--cold-weights"],
                                 capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                m = re.match(r"(conv|gemm|gemv|wino)\s+(.*?)\s+([0-9.]+) ms", line)
                if m:
                    times[m.group(2)][b].append(float(m.group(3)))
    logs = []
    for layer, per_bin in times.items():
        if len(per_bin) < len(bins):
            continue
        mins = [min(per_bin[b]) for b in bins]
        meds = [sorted(per_bin[b])[len(per_bin[b]) // 2] for b in bins]
        logs.append(math.log(mins[1] / mins[0]))
        cols = "  ".join(f"{lo:7.3f}/{md:7.3f}" for lo, md in zip(mins, meds))
        print(f"{layer:50s} {cols}   min ratio {mins[1] / mins[0]:.3f}")
    if logs:
        print(f"geomean of the min ratio (second / first) over {len(logs)} layers: {math.exp(sum(logs) / len(logs)):.3f}")


if __name__ == "__main__":
    main()
