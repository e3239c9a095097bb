#!/usr/bin/env python3
"""nnfuse's generated CPU kernels (`--target host`) vs ONNX Runtime, in the same run, same thread
count, batch 1: median latency per model and thread count, the ratio nnfuse/ORT and its geometric
mean, nnfuse's planned vs unplanned activation memory, and the peak resident memory (max RSS) of
each side's process. Prints a Markdown table.

Each model is exported from the zoo, compiled once with `nnfuse compile` (kernel cache:
$NNFUSE_CACHE_DIR), then timed by `nnfuse run DIR --runs N --threads T` (median over N runs after
a warm-up run) and by onnxruntime with intra_op_num_threads = T (median over N runs after one
warm-up), alternating so that both see the same machine load. ONNX Runtime runs in a child
process of this script (`--ort-child`) so that each side's peak RSS is its own (os.wait4); both
peaks include the weights, the runtime and the Python/CLI process itself. Each side also reports
its process CPU time per run (user + system, all threads): on a machine shared with other work a
single-threaded run's CPU time moves much less with the load than its wall time.

Usage: python3 bench/host_vs_ort.py [--cli build/bindings/nnfuse] [--models resnet50,mobilenetv2,...]
                                    [--threads 1,2] [--runs 10] [--workdir DIR]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CLI = os.path.join(HERE, "..", "build", "bindings", "nnfuse")
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


# A fresh small process that forks and execs the measured command and reports that child's peak RSS.
# Linux carries a process's RSS high-water mark across fork and exec, so a child forked directly from
# this script (which has numpy/onnx/onnxruntime loaded) would report at least this script's RSS.
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n")


def run_measured(argv):
    """Runs argv; returns (stdout, stderr, returncode, peak RSS of that process in MiB)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        r = subprocess.run([sys.executable, "-c", _LAUNCHER, rss.name, *map(str, argv)], capture_output=True, text=True)
        kib = rss.read().strip()
    return r.stdout, r.stderr, r.returncode, (int(kib) / 1024 if kib else float("nan"))


def cli(path, *args, rss=False):
    """Runs `nnfuse ARGS --json` and returns its JSON; with rss=True, (JSON, the process's peak RSS in MiB)."""
    argv = [path, *map(str, args), "--json"]
    if rss:
        out, err, rc, peak = run_measured(argv)
    else:
        r = subprocess.run(argv, capture_output=True, text=True)
        out, err, rc = r.stdout, r.stderr, r.returncode
    if rc != 0:
        raise SystemExit(f"nnfuse {' '.join(map(str, args))} failed: {err.strip()[-2000:]}")
    return (json.loads(out), peak) if rss else json.loads(out)


def ort_child(model, inputs, threads, runs):
    """--ort-child: time ONNX Runtime on saved inputs; prints {"ms": [...]} on stdout."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = {k: np.load(f) for k, f in (kv.split("=", 1) for kv in inputs)}
    sess.run(None, feeds)
    ms, cpu = [], []
    for _ in range(runs):
        s, c = time.perf_counter(), time.process_time()
        sess.run(None, feeds)
        ms.append((time.perf_counter() - s) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    print(json.dumps({"ms": ms, "cpu_ms": cpu}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=DEFAULT_CLI)
    ap.add_argument("--models", default="resnet50,mobilenetv2,efficientnet_b0,bert_base,gpt2,vit_b16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--workdir", default="/tmp/nnfuse_bench")
    ap.add_argument("--ort-child", nargs=3, metavar=("MODEL", "THREADS", "RUNS"), help=argparse.SUPPRESS)
    ap.add_argument("--input", action="append", default=[], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ort_child:
        return ort_child(a.ort_child[0], a.input, int(a.ort_child[1]), int(a.ort_child[2]))
    os.makedirs(a.workdir, exist_ok=True)
    from test_zoo_ort import make_inputs  # seeded inputs (ids within the vocab, masks)

    rows = []
    for name in a.models.split(","):
        path = os.path.join(a.workdir, f"{name}.onnx")
        if not os.path.exists(path):
            cli(a.cli, "zoo", "export", name, "-o", path)
        art = os.path.join(a.workdir, f"{name}.nnf")
        t0 = time.time()
        comp = cli(a.cli, "compile", path, "-o", art, "--no-profile")
        compile_s = time.time() - t0
        model = onnx.load(path, load_external_data=False)
        feeds = make_inputs(model, "")
        in_args = []
        for i, (k, v) in enumerate(feeds.items()):
            f = os.path.join(a.workdir, f"{name}_in{i}.npy")
            np.save(f, v)
            in_args += ["--input", f"{k}={f}"]
        mem = comp["compile"]["memory"]
        for t in map(int, a.threads.split(",")):
            out, err, rc, ort_rss = run_measured([sys.executable, os.path.abspath(__file__), "--ort-child", path, str(t),
                                                  str(a.runs)] + [f"--input={x}" for x in in_args[1::2]])
            if rc != 0:
                raise SystemExit(f"onnxruntime on {name} failed: {err.strip()[-2000:]}")
            ort_out = json.loads(out)
            ort_ms, ort_cpu = ort_out["ms"], ort_out["cpu_ms"]
            j, nnf_rss = cli(a.cli, "run", art, *in_args, "--threads", t, "--runs", a.runs + 1, rss=True)
            nnf = j["latency_ms"]["median"]
            orm = float(np.median(ort_ms))
            rows.append(dict(model=name, threads=t, nnfuse_ms=nnf, ort_ms=orm, ratio=nnf / orm,
                             nnfuse_min=j["latency_ms"]["min"], ort_min=float(np.min(ort_ms)),
                             nnfuse_cpu=j.get("cpu_ms", {}).get("median", math.nan), ort_cpu=float(np.median(ort_cpu)),
                             kernels=mem["blocks"], fallback=mem["fallback_blocks"],
                             peak_mib=mem["peak_activation_bytes"] / 2**20, naive_mib=mem["naive_activation_bytes"] / 2**20,
                             nnfuse_rss_mib=nnf_rss, ort_rss_mib=ort_rss, compile_s=compile_s))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| model | threads | nnfuse median (min) ms | ORT median (min) ms | nnfuse/ORT median (min) | CPU ms per run nnfuse / ORT (ratio) "
          "| kernels (fallback) | activations planned / unplanned MiB | peak RSS nnfuse / ORT MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['threads']} | {r['nnfuse_ms']:.2f} ({r['nnfuse_min']:.2f}) | {r['ort_ms']:.2f} ({r['ort_min']:.2f}) | "
              f"{r['ratio']:.2f} ({r['nnfuse_min'] / r['ort_min']:.2f}) | "
              f"{r['nnfuse_cpu']:.2f} / {r['ort_cpu']:.2f} ({r['nnfuse_cpu'] / r['ort_cpu']:.2f}) | "
              f"{r['kernels']} ({r['fallback']}) | {r['peak_mib']:.1f} / {r['naive_mib']:.1f} | "
              f"{r['nnfuse_rss_mib']:.0f} / {r['ort_rss_mib']:.0f} |")
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    for t in sorted({r["threads"] for r in rows}):
        sel = [r for r in rows if r["threads"] == t]
        print(f"\ngeomean nnfuse/ORT at {t} thread(s): median {geo([r['ratio'] for r in sel]):.2f}, "
              f"min {geo([r['nnfuse_min'] / r['ort_min'] for r in sel]):.2f}, "
              f"CPU per run {geo([r['nnfuse_cpu'] / r['ort_cpu'] for r in sel]):.2f}")


if __name__ == "__main__":
    main()
