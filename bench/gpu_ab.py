#!/usr/bin/env python3
"""A/B of a device-kernel setting on a GPU, interleaved in one process (bench/gpu.sh machines).

Each model is exported once and fed the same inputs; for each round, `nnfuse run --target T` runs
once per value of the environment variable (A, B, A, B, ...), and every output is checked against
ONNX Runtime (CPU). Prints one JSON line per run and a summary of median latencies per value.

    python3 bench/gpu_ab.py --env NNFUSE_DEVICE_SPLIT_K --values 512,0 --models resnet50,bert_base
    python3 bench/gpu_ab.py --env NNFUSE_DEVICE_PRECISION --values fp32,fp16   # tensor cores
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import cli, compare, feeds_for, run_nnfuse, run_ort  # noqa: E402


def scaled_error(got, want) -> float:
    """The largest |error| of any float output over that output's largest |value|: how reduced
    precision (NNFUSE_DEVICE_PRECISION=fp16) is judged, where `worst` (fp32 tolerances) fails."""
    rel = 0.0
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            return float("inf")
        if w.dtype.kind == "f" and w.size:
            rel = max(rel, float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-3)))
    return rel


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="volta-cuda")
    ap.add_argument("--env", required=True)
    ap.add_argument("--values", required=True)
    ap.add_argument("--models", default="resnet50,bert_base,gpt2,vit_b16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default="/tmp/gpu_ab")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    values = a.values.split(",")
    summary = {}
    import subprocess

    for name in a.models.split(","):
        path = out / f"{name}.onnx"
        subprocess.run([cli(), "zoo", "export", name, "-o", str(path)], check=True, capture_output=True)
        feeds = feeds_for(path, 1)
        want, _ = run_ort(path, feeds, 1)
        for rnd in range(a.rounds):
            for v in values:
                os.environ[a.env] = v
                work = out / f"w_{name}_{v}"
                work.mkdir(exist_ok=True)
                got, rep = run_nnfuse(path, feeds, None, a.target, a.runs, work)
                ok, worst = compare(got, want)
                row = {"model": name, a.env: v, "round": rnd, "ms": rep["latency_ms"]["median"], "ok": ok, "worst": worst,
                       "rel": scaled_error(got, want),
                       "compile_ms": rep.get("compile_ms"), "forms": rep.get("compile", {}).get("kernel_forms")}
                summary.setdefault(name, {}).setdefault(v, []).append(row["ms"])
                print(json.dumps(row), flush=True)
    print(f"| model | " + " | ".join(f"{a.env}={v} ms" for v in values) + f" | {values[0]} / {values[-1]} |")
    print("|---|" + "---|" * (len(values) + 1))
    for name, per in summary.items():
        med = [float(np.median(per[v])) for v in values]
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in med) + f" | {med[0] / med[-1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
