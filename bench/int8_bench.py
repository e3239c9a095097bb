#!/usr/bin/env python3
"""Quantized models: nnfuse's int8 kernels vs its float kernels vs ONNX Runtime, in one run (issue 18).

For each zoo model: `nnfuse zoo export`, then ONNX Runtime's own tools make the int8 model as a
user would (`quant_pre_process`, then `quantize_static` in the QDQ format, per-channel int8
weights, uint8 activations, 4 calibration batches of random inputs; BERT quantizes its MatMul and
Gemm only, `op_types_to_quantize`). Engines, each timed in its own process, rounds interleaved:
  nnfuse int8   `nnfuse compile` of the QDQ model (int8 kernels where the host has AVX-512 VNNI)
  nnfuse float  the same model compiled with NNFUSE_INT8=0 (the QDQ pairs as float arithmetic)
  ORT int8      ONNX Runtime on the QDQ model (ORT_ENABLE_ALL turns QDQ into QLinearConv/QGemm...)
  nnfuse fp32, ORT fp32   the original float model
Latency: median over all timed runs of all rounds (one warm-up run per process). Accuracy: each
quantized engine's outputs against ORT's fp32 outputs of the original model on the same inputs,
as max |error| / max |reference| and, for the classifiers, whether the top-1 class agrees.

  python3 bench/int8_bench.py --models resnet50,mobilenetv2,bert_base --threads 1,2 --rounds 3
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CLI = os.path.join(HERE, "..", "build", "bindings", "nnfuse")


def feeds_for(model_path, seed):
    m = onnx.load(model_path, load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in m.graph.input:
        if i.name in init:
            continue
        shape = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == onnx.TensorProto.INT64:  # token ids, or an attention mask of ones
            feeds[i.name] = np.ones(shape, np.int64) if "mask" in i.name else rng.integers(0, 30000, shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def quantize(src, dst, transformer):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    pre = dst + ".pre.onnx"
    quant_pre_process(src, pre)

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.n = 0

        def get_next(self):
            if self.n >= 4:
                return None
            self.n += 1
            return feeds_for(src, 100 + self.n)

    extra = {"op_types_to_quantize": ["MatMul", "Gemm"]} if transformer else {}
    quantize_static(pre, dst, Calibration(), quant_format=QuantFormat.QDQ, per_channel=True, **extra)
    os.remove(pre)


def save_feeds(feeds, d):
    os.makedirs(d, exist_ok=True)
    args = []
    for k, v in feeds.items():
        p = os.path.join(d, k + ".npy")
        np.save(p, v)
        args += ["--input", f"{k}={p}"]
    return args


def nnfuse_time(cli, art, threads, runs, input_args, outputs=None):
    cmd = [cli, "run", art, "--threads", str(threads), "--runs", str(runs + 1), "--json"] + input_args
    if outputs:
        cmd += ["--outputs", outputs]
    r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return r["latency_ms"]["median"]


ORT_CHILD = r"""
import sys, time, json, numpy as np, onnxruntime as ort
path, threads, runs, fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import os
so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
feeds = {i.name: np.load(os.path.join(fd, i.name + ".npy")) for i in s.get_inputs()}
out = s.run(None, feeds)
t = []
for _ in range(runs):
    t0 = time.perf_counter(); s.run(None, feeds); t.append((time.perf_counter() - t0) * 1e3)
np.savez(os.path.join(fd, "ort_out_" + os.path.basename(path) + ".npz"), *out)
print(json.dumps(float(np.median(t))))
"""


def ort_time(path, threads, runs, feed_dir):
    r = subprocess.run([sys.executable, "-c", ORT_CHILD, path, str(threads), str(runs), feed_dir], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenetv2,bert_base")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--workdir", default="/tmp/nnfuse_int8_bench")
    ap.add_argument("--cli", default=DEFAULT_CLI)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    w = lambda *p: os.path.join(a.workdir, *p)
    results = []
    for name in a.models.split(","):
        transformer = name in ("bert_base", "bert_tiny", "gpt2", "vit_b16")
        fp32 = w(name + ".onnx")
        qdq = w(name + "_qdq.onnx")
        if not os.path.exists(fp32):
            subprocess.run([a.cli, "zoo", "export", name, "-o", fp32], check=True, capture_output=True)
        if not os.path.exists(qdq):
            quantize(fp32, qdq, transformer)
        feed_dir = w(name + "_feeds")
        input_args = save_feeds(feeds_for(fp32, 7), feed_dir)
        arts = {"int8": (qdq, {}), "float": (qdq, {"NNFUSE_INT8": "0"}), "fp32": (fp32, {})}
        for k, (src, env) in arts.items():
            t0 = time.time()
            subprocess.run([a.cli, "compile", src, "-o", w(f"{name}_{k}")], check=True, capture_output=True, env={**os.environ, **env})
            print(f"# compiled {name} {k} in {time.time() - t0:.1f} s", flush=True)
        # Accuracy against ORT fp32 on the original model.
        ort_time(fp32, 1, 1, feed_dir)
        ref = list(np.load(os.path.join(feed_dir, "ort_out_" + os.path.basename(fp32) + ".npz")).values())
        ort_time(qdq, 1, 1, feed_dir)
        ort_q = list(np.load(os.path.join(feed_dir, "ort_out_" + os.path.basename(qdq) + ".npz")).values())
        nnfuse_time(a.cli, w(f"{name}_int8"), 1, 1, input_args, outputs=w(f"{name}_int8_out"))
        outs = [os.path.join(w(f"{name}_int8_out"), o.name + ".npy") for o in onnx.load(fp32, load_external_data=False).graph.output]
        nf_q = [np.load(p) for p in outs]
        acc = {}
        for label, got in (("nnfuse int8", nf_q), ("ORT int8", ort_q)):
            err = max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-12)) for g, r in zip(got, ref))
            top1 = bool(np.argmax(got[-1]) == np.argmax(ref[-1])) if not transformer else None
            acc[label] = (err, top1)
        for threads in [int(t) for t in a.threads.split(",")]:
            times = {k: [] for k in ("int8", "float", "ort_int8", "fp32", "ort_fp32")}
            for _ in range(a.rounds):
                for k in ("int8", "float", "fp32"):
                    times[k].append(nnfuse_time(a.cli, w(f"{name}_{k}"), threads, a.runs, input_args))
                times["ort_int8"].append(ort_time(qdq, threads, a.runs, feed_dir))
                times["ort_fp32"].append(ort_time(fp32, threads, a.runs, feed_dir))
            med = {k: float(np.median(v)) for k, v in times.items()}
            results.append((name, threads, med, acc))
            print(f"{name} t={threads}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items()), flush=True)
    print("\n| model | threads | nnfuse int8 ms | nnfuse float path ms | ORT int8 ms | nnfuse int8 / ORT int8 | int8 / float path | "
          "nnfuse fp32 ms | ORT fp32 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, threads, m, _ in results:
        print(f"| {name} | {threads} | {m['int8']:.2f} | {m['float']:.2f} | {m['ort_int8']:.2f} | {m['int8'] / m['ort_int8']:.2f} | "
              f"{m['int8'] / m['float']:.2f} | {m['fp32']:.2f} | {m['ort_fp32']:.2f} |")
    print("\nAccuracy against ORT fp32 on the original model (max |error| / max |reference|, top-1 agreement):")
    seen = set()
    for name, _, _, acc in results:
        if name in seen:
            continue
        seen.add(name)
        print(f"- {name}: " + "; ".join(f"{k} {e:.4f}" + ("" if t is None else f", top-1 {'same' if t else 'differs'}") for k, (e, t) in acc.items()))


if __name__ == "__main__":
    main()
