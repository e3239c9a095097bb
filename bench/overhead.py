#!/usr/bin/env python3
"""The runtime's fixed costs on tiny models (issue 21): where a model does almost no arithmetic,
latency is the per-run and per-kernel overhead of the runtime.

Models (built here with onnx.helper, float32, batch 1):
  chain_N   x[1,16] -> N x (MatMul 16x16 -> Relu): N kernels (each MatMul an anchor, its Relu the
            epilogue), for N in --chain (default 1, 9, 33). The per-kernel cost is the slope of
            latency over N; the per-run cost the intercept.
  wakeword  a keyword-spotting MLP: x[1,40] (MFCC frame) -> Gemm 40x128 + Relu -> Gemm 128x128 +
            Relu -> Gemm 128x12 -> Softmax (3 kernels, ~23 kFLOP).

Each model is compiled once (`nnfuse compile`) and timed by `nnfuse run DIR --runs R --threads T`
(median of R runs after a warm-up run) and by ONNX Runtime in this process (median of R runs of
InferenceSession.run after a warm-up, intra_op_num_threads = T), alternating, for --rounds rounds.
The reported figure is the median over rounds of the per-round medians.

Usage: python3 bench/overhead.py [--cli build/bindings/nnfuse] [--threads 1] [--runs 2000] [--rounds 3]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CLI = os.path.join(HERE, "..", "build", "bindings", "nnfuse")


def weight(rng, name, shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def chain_model(n):
    rng = np.random.default_rng(n)
    nodes, inits, x = [], [], "x"
    for i in range(n):
        inits.append(weight(rng, f"w{i}", [16, 16]))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"y{i}"]))
        x = f"y{i}"
    g = helper.make_graph(nodes, f"chain_{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16])], inits)
    return g, {"x": rng.standard_normal((1, 16)).astype(np.float32)}


def wakeword_model():
    rng = np.random.default_rng(7)
    dims = [40, 128, 128, 12]
    nodes, inits, x = [], [], "mfcc"
    for i in range(3):
        inits += [weight(rng, f"fc{i}.weight", [dims[i + 1], dims[i]]), weight(rng, f"fc{i}.bias", [dims[i + 1]])]
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [f"fc{i}"], transB=1))
        x = f"fc{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [x], [f"relu{i}"]))
            x = f"relu{i}"
    nodes.append(helper.make_node("Softmax", [x], ["probs"], axis=1))
    g = helper.make_graph(nodes, "wakeword", [helper.make_tensor_value_info("mfcc", TensorProto.FLOAT, [1, 40])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 12])], inits)
    return g, {"mfcc": rng.standard_normal((1, 40)).astype(np.float32)}


def run_json(argv):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv[:3]))} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=DEFAULT_CLI)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chain", default="1,9,33")
    ap.add_argument("--workdir", default="/tmp/nnfuse_overhead")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    models = [(f"chain_{n}", *chain_model(int(n))) for n in a.chain.split(",")] + [("wakeword", *wakeword_model())]
    rows = []
    for name, g, feeds in models:
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        path = os.path.join(a.workdir, f"{name}.onnx")
        onnx.save(m, path)
        art = os.path.join(a.workdir, f"{name}.nnf")
        comp = run_json([a.cli, "compile", path, "-o", art, "--no-profile", "--json"])
        in_args = []
        for k, v in feeds.items():
            f = os.path.join(a.workdir, f"{name}_{k}.npy")
            np.save(f, v)
            in_args += ["--input", f"{k}={f}"]
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        nnf, orts = [], []
        for _ in range(a.rounds):
            j = run_json([a.cli, "run", art, *in_args, "--runs", a.runs, "--threads", a.threads, "--json"])
            nnf.append(j["latency_ms"]["median"] * 1e3)
            ts = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                ts.append(time.perf_counter() - t0)
            orts.append(float(np.median(ts)) * 1e6)
        rows.append(dict(model=name, kernels=comp["compile"]["memory"]["blocks"], nnfuse_us=float(np.median(nnf)),
                         ort_us=float(np.median(orts))))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"threads {a.threads}, {a.runs} runs x {a.rounds} rounds\n")
    print("| model | kernels | nnfuse µs | ORT µs (InferenceSession.run from Python) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['kernels']} | {r['nnfuse_us']:.2f} | {r['ort_us']:.2f} |")
    chains = [r for r in rows if r["model"].startswith("chain_")]
    if len(chains) >= 2:
        k = np.array([r["kernels"] for r in chains], float)
        for side in ("nnfuse_us", "ort_us"):
            y = np.array([r[side] for r in chains])
            slope, icpt = np.polyfit(k, y, 1)
            print(f"\n{side[:-3]}: {slope:.3f} µs per kernel, {icpt:.2f} µs per run (least squares over the chains)")


if __name__ == "__main__":
    main()
