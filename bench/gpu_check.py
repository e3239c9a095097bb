#!/usr/bin/env python3
"""GPU check for the device targets (issue 17; bench/gpu.sh runs it on a machine with a GPU).

For every tiny zoo model, a few full-size zoo models and every framework-shaped export of the test
suite (tests/python/test_framework_exports.py): `nnfuse run --target T --pipeline auto` with the
same inputs as ONNX Runtime (CPU execution provider: the oracle), outputs compared within
RTOL/ATOL, and the latency of both (median of --runs after a warm-up run; ORT with its default
threads on this machine). Writes gpu_check.json and gpu_check.md into the output folder.

    python3 bench/gpu_check.py --target volta-cuda --out /tmp/gpu [--full resnet50,bert_base] [--runs 20]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
TINY = ["resnet_tiny", "mobilenet_tiny", "efficientnet_tiny", "ssd_tiny", "bert_tiny", "gpt2_tiny", "vit_tiny", "lstm_tiny"]
RTOL, ATOL = 1e-3, 1e-4


def cli() -> str:
    return os.environ.get("NNFUSE_CLI", str(ROOT / "build" / "bindings" / "nnfuse"))


def feeds_for(path: Path, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for a static-shape model (token ids in [0, 10), masks of ones, floats in [-1, 1))."""
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dt, np.integer) and "mask" in i.name:
            # An attention mask of ones: random 0..9 "masks" add +-90000 to the scores, where one
            # float ulp is 0.008 and the softmax is ill-conditioned for any two summation orders.
            feeds[i.name] = np.ones(shape, dtype=dt)
        elif np.issubdtype(dt, np.integer):
            feeds[i.name] = rng.integers(0, 10, size=shape).astype(dt)
        else:
            feeds[i.name] = rng.uniform(-1, 1, size=shape).astype(dt)
    return feeds


def run_ort(path: Path, feeds, runs: int):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(names, feeds)))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(names, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return out, float(np.median(times))


def run_nnfuse(path: Path, feeds, shapes, target: str, runs: int, work: Path):
    args = [cli(), "run", str(path), "--target", target, "--pipeline", "auto", "--runs", str(runs), "--json"]
    for k, (name, arr) in enumerate(feeds.items()):
        f = work / f"in_{k}.npy"
        np.save(f, np.array(arr, order="C"))  # ascontiguousarray would make a scalar 1-D
        args += ["--input", f"{name}={f}"]
    for name, dims in (shapes or {}).items():
        args += ["--shape", f"{name}={','.join(map(str, dims))}"]
    outdir = work / "out"
    outdir.mkdir(exist_ok=True)
    args += ["--outputs", str(outdir)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-3000:])
    rep = json.loads(p.stdout)
    return {o["name"]: np.load(o["file"]) for o in rep["outputs"]}, rep


def compare(got, want) -> tuple[bool, float]:
    worst = 0.0
    ok = set(got) == set(want)
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            return False, float("inf")
        if w.dtype.kind == "f":
            err = np.abs(g.astype(np.float64) - w) / (ATOL + RTOL * np.abs(w))
            worst = max(worst, float(err.max()) if err.size else 0.0)
        elif not np.array_equal(g, w):
            ok = False
    return ok and worst <= 1.0, worst


def cases(full: list[str], framework: bool, work: Path):
    for name in TINY + full:
        path = work / f"{name}.onnx"
        subprocess.run([cli(), "zoo", "export", name, "-o", str(path)], check=True, capture_output=True)
        yield "zoo", name, path, feeds_for(path, 1), None
    if framework:
        sys.path.insert(0, str(ROOT / "tests" / "python"))
        from test_framework_exports import CASE_BUILDERS  # noqa: E402

        for name in sorted(CASE_BUILDERS):
            ec = CASE_BUILDERS[name]()
            path = work / f"{name}.onnx"
            onnx.save(ec.model, str(path))
            yield "export", name, path, ec.feeds, ec.shapes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="volta-cuda")
    ap.add_argument("--out", default="/tmp/gpu_check")
    ap.add_argument("--full", default="resnet50,mobilenetv2,efficientnet_b0,bert_base,gpt2,vit_b16")
    ap.add_argument("--no-framework", action="store_true")
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    full = [f for f in a.full.split(",") if f]
    for kind, name, path, feeds, shapes in cases(full, not a.no_framework, out):
        work = out / f"w_{name}"
        work.mkdir(exist_ok=True)
        row = {"kind": kind, "model": name}
        try:
            want, ort_ms = run_ort(path, feeds, a.runs)
            got, rep = run_nnfuse(path, feeds, shapes, a.target, a.runs, work)
            ok, worst = compare(got, want)
            comp = rep.get("compile", {})
            row.update(ok=ok, worst=worst, ms=rep["latency_ms"]["median"], ort_cpu_ms=ort_ms, compile_ms=rep.get("compile_ms"),
                       kernels=comp.get("kernels"), host_stages=comp.get("host_stages"), forms=comp.get("kernel_forms"),
                       device=comp.get("device", {}).get("name"))
        except Exception as e:  # one model's failure is a row, not the end of the check
            row.update(ok=False, error=str(e)[-1500:])
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "gpu_check.json").write_text(json.dumps(rows, indent=1))
    lines = [f"| model | matches ORT | worst err/tol | {a.target} ms | ORT CPU ms | ratio | kernels | host stages |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ms" in r:
            lines.append(f"| {r['model']} | {'yes' if r['ok'] else 'NO'} | {r['worst']:.3g} | {r['ms']:.3f} | {r['ort_cpu_ms']:.3f} | "
                         f"{r['ms'] / r['ort_cpu_ms']:.2f} | {r['kernels']} | {r['host_stages']} |")
        else:
            lines.append(f"| {r['model']} | error: {r['error'].splitlines()[-1][:120] if r['error'] else ''} | | | | | | |")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
