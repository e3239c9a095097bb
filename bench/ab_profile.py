#!/usr/bin/env python3
"""Compares compiled artifacts of one model kernel by kernel, interleaved (issues 21, 22).

    python3 bench/ab_profile.py A.nnf B.nnf [C.nnf ...] [--rounds 3] [--runs 10] [--threads 1]

Each round runs `nnfuse run ART --profile --json` once per artifact, in turn, so that a slow spell
of a shared machine hits every artifact alike. Per kernel it keeps the minimum over the rounds of
the per-run medians that `--profile` reports: on a noisy VM the end-to-end medians of one model
moved by 30% between runs while these minima moved by a few percent. Prints, per kernel, its ops,
the time of the first artifact and every other artifact's time as a ratio to it, then the sums.
The artifacts must come from one model with the same plan (compile them with --no-profile so that
the same convolution algorithms are chosen); build the variants by compiling with different kernel
headers (NNFUSE_KERNEL_INCLUDE) or flags (NNFUSE_KERNEL_CXXFLAGS).
"""
import argparse
import collections
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CLI = os.environ.get("NNFUSE_CLI", os.path.join(HERE, "..", "build", "bindings", "nnfuse"))


def profile(cli, art, runs, threads):
    out = subprocess.run([cli, "run", art, "--runs", str(runs), "--threads", str(threads), "--profile", "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ab_profile: nnfuse run {art} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--cli", default=DEFAULT_CLI)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if len(a.artifacts) < 2:
        sys.exit("ab_profile: give at least two artifacts")
    ms = {art: collections.defaultdict(list) for art in a.artifacts}
    ops, latency = {}, {art: [] for art in a.artifacts}
    for _ in range(a.rounds):
        for art in a.artifacts:
            d = profile(a.cli, art, a.runs, a.threads)
            for p in d["profile"]:
                ms[art][p["kernel"]].append(p["ms"])
                ops.setdefault(p["kernel"], "+".join(p["ops"]))
            latency[art].append(d["latency_ms"]["median"])
    base = a.artifacts[0]
    kernels = list(ms[base])
    for art in a.artifacts[1:]:
        if set(ms[art]) != set(kernels):
            sys.exit(f"ab_profile: {art} has other kernels than {base}: not the same plan")
    print(f"{'kernel':8s} {'ops':32s} {'ms':>8s} " + " ".join(f"{'x' + str(i + 1):>6s}" for i in range(len(a.artifacts) - 1)))
    best = {art: {k: min(v) for k, v in ms[art].items()} for art in a.artifacts}
    for k in kernels:
        b = best[base][k]
        ratios = " ".join(f"{best[art][k] / b:6.2f}" if b > 0 else "     -" for art in a.artifacts[1:])
        print(f"{k:8s} {ops[k][:32]:32s} {b:8.3f} {ratios}")
    for i, art in enumerate(a.artifacts):
        tag = "base" if i == 0 else f"x{i}"
        print(f"{tag:5s} {art}: sum of kernel minima {sum(best[art].values()):.2f} ms; "
              f"latency medians {', '.join(f'{x:.1f}' for x in latency[art])} ms")


if __name__ == "__main__":
    main()
