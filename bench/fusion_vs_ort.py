#!/usr/bin/env python3
"""Issue 4's comparison: per zoo model, operators before, kernels after nnfuse's fusion plan, and
the node count of the same model after ONNX Runtime's ORT_ENABLE_ALL optimization (Constant nodes
excluded), plus nnfuse's planning time. Prints a Markdown table.

Usage: python3 bench/fusion_vs_ort.py [--cli build/bindings/nnfuse] [--models a,b] [--opset 13]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CLI = os.path.join(HERE, "..", "build", "bindings", "nnfuse")
TRANSFORMERS = {"transformer_encoder", "transformer_decoder"}


def cli(path, *args):
    r = subprocess.run([path, *map(str, args), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"nnfuse {' '.join(map(str, args))} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def ort_nodes(model_path, out_path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = out_path
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    m = onnx.load(out_path, load_external_data=False)
    return sum(1 for n in m.graph.node if n.op_type != "Constant")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=DEFAULT_CLI)
    ap.add_argument("--models", default="")
    ap.add_argument("--opset", type=int, default=13)
    ap.add_argument("--pipeline", default="auto")
    a = ap.parse_args()
    zoo = cli(a.cli, "zoo", "list")
    zoo = zoo["models"] if isinstance(zoo, dict) else zoo
    wanted = set(filter(None, a.models.split(",")))
    rows = []
    rewrites = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in zoo:
            if wanted and m["name"] not in wanted:
                continue
            if not wanted and m.get("tiny"):
                continue
            path = os.path.join(tmp, m["name"] + ".onnx")
            cli(a.cli, "zoo", "export", m["name"], "-o", path, "--opset", a.opset)
            t0 = time.perf_counter()
            rep = cli(a.cli, "optimize", path, "--pipeline", a.pipeline, "--no-profile")
            wall = time.perf_counter() - t0
            plan_ms = next((p["ms"] for p in rep["passes"] if p["name"] == "fusion-plan"), float("nan"))
            n_ort = ort_nodes(path, os.path.join(tmp, m["name"] + ".ort.onnx"))
            rewrite_ms = sum(p["ms"] for p in rep["passes"] if p["name"] != "fusion-plan")
            rows.append((m["name"], m.get("network_class", m.get("class", "")), rep["ops_before"], rep["ops_after_rewrite"], rep["kernels"],
                         n_ort, plan_ms, rep["optimize_ms"], wall))
            rewrites.append((m["name"], rep["ops_before"], rep["ops_after_rewrite"], rep["flops_before"], rep["flops_after"],
                             rewrite_ms, sum(rep["rules_fired"].values())))
            os.remove(path)
            print(f"{m['name']}: {rep['kernels']} kernels vs ORT {n_ort} nodes", file=sys.stderr)
    print(f"| model | class | ops before | ops after rewrite | nnfuse kernels | ORT nodes (ENABLE_ALL) | kernels/ORT | plan ms | optimize ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, cls, before, after, k, n, plan_ms, opt_ms, wall in rows:
        goal = "≤ 0.5" if cls in TRANSFORMERS else "< 1"
        print(f"| {name} | {cls} | {before} | {after} | {k} | {n} | {k / n:.2f} (goal {goal}) | {plan_ms:.1f} | {opt_ms:.1f} |")
    print()
    print("| model | ops before | ops after rewrite | GFLOP before | GFLOP after | rewrite ms | rewrites applied |")
    print("|---|---|---|---|---|---|---|")
    for name, before, after, fb, fa, ms, fired in rewrites:
        print(f"| {name} | {before} | {after} | {fb / 1e9:.3f} | {fa / 1e9:.3f} | {ms:.1f} | {fired} |")


if __name__ == "__main__":
    main()


def gflop(x):
    return f"{x / 1e9:.3f}"
