#!/usr/bin/env python3
"""nnfuse (`--target host`) vs ONNX Runtime vs OpenVINO on the same models, in one run (issue 21).

Each engine runs in its own process (nnfuse: `nnfuse run DIR` of an artifact compiled once with
`nnfuse compile` as a user runs it, so that convolution algorithms are timed on this machine;
`--no-profile` passes that flag on for the deterministic cost model; ORT and OpenVINO: a child
of this script), with a fixed thread count
and batch 1. Rounds are interleaved (round r runs nnfuse, ORT, OpenVINO in turn, then r+1 again), so
that all three see the same machine load; each process does one warm-up run and then `--runs` timed
runs, and the latency of an engine is the median over all its timed runs of all rounds. Process
CPU time per run is reported too (on a shared machine it moves less with the load than wall time),
and so is each engine's best round (its least per-process median), with the ratios and geomeans
of those: on a VM that slows whole processes at a time, for every engine alike, the median over
all runs follows how many slow processes each engine drew.

Outputs are checked: every engine's outputs of the first round against ONNX Runtime's, within
--rtol/--atol of the largest |ORT output| (a wrong answer is never a win).

OpenVINO runs on its CPU plugin with INFERENCE_PRECISION_HINT=f32 (no bf16 down-conversion on
CPUs that have AVX-512 BF16), PERFORMANCE_HINT=LATENCY and INFERENCE_NUM_THREADS = the thread count.
ORT runs with ORT_ENABLE_ALL, intra_op_num_threads = the thread count, inter_op 1.

Needs `pip install openvino` (not installed by scripts/setup.sh: the tests do not use it).

Models: zoo names (exported by `nnfuse zoo export`) and the CNN-shaped framework exports of the
test suite (tests/python/test_framework_exports.py, with their --shape bindings), e.g.
  python3 bench/peers.py --models resnet50,mobilenetv2,efficientnet_b0 --threads 1,2
  python3 bench/peers.py --models cnn-exports --threads 1,2
  python3 bench/peers.py --models zoo-seq,seq-exports --threads 1,2
Prints a Markdown table per thread count and the geometric means of nnfuse/ORT and nnfuse/OpenVINO,
with each engine's peak resident set (the largest over its processes: weights, activations and
runtime; measured by GNU time, /usr/bin/time, when present). `--models long-seq` adds a Whisper-tiny-shaped encoder over 1500
frames (bench/long_seq_models.py), where the attention scores are 54 MB per layer unfused.

--busy N runs N busy-loop processes while the engines are timed (not while nnfuse compiles): a
shared machine where another tenant takes a core, made reproducible, e.g.
  python3 bench/peers.py --models zoo-cnns --threads 2 --busy 1
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CLI = os.path.join(HERE, "..", "build", "bindings", "nnfuse")
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

# The CNN-shaped framework exports of the test suite (builders in test_framework_exports.py).
CNN_EXPORTS = ["pytorch_cnn_opset13", "tf2onnx_cnn_opset13", "paddle_cnn_opset13", "pytorch_mobilenetv3_opset14",
               "pytorch_resnext_pad_opset13", "pytorch_fpn_upsample_opset13", "pytorch_unet_decoder_opset13",
               "pytorch_speech_frontend_opset17"]
ZOO_CNNS = ["resnet50", "mobilenetv2", "efficientnet_b0"]
# The transformer- and RNN-shaped exports of the test suite, and the zoo's transformers and LSTM (issue 22).
SEQ_EXPORTS = ["pytorch_encoder_opset13", "pytorch_encoder_opset17", "pytorch_transformer_ln_opset17", "pytorch_dynamo_attention_opset18",
               "pytorch_gru_opset14", "pytorch_vad_opset16", "pytorch_vad_if_opset16", "tf2onnx_loop_rnn_opset13"]
ZOO_SEQ = ["bert_base", "gpt2", "vit_b16", "lstm_seq2seq"]
# Long sequences (bench/long_seq_models.py): a Whisper-tiny-shaped encoder over 1500 frames.
LONG_SEQ = ["encoder_1500"]
GROUPS = {"cnn-exports": CNN_EXPORTS, "zoo-cnns": ZOO_CNNS, "seq-exports": SEQ_EXPORTS, "zoo-seq": ZOO_SEQ, "long-seq": LONG_SEQ}


def child(engine, model, threads, runs, inputs, out_dir):
    """--child: time one engine on saved inputs; prints {"ms": [...], "cpu_ms": [...]} and saves outputs."""
    feeds = {k: np.load(f) for k, f in (kv.split("=", 1) for kv in inputs)}
    if engine == "ort":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        run = lambda: sess.run(None, feeds)
    else:
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(core.read_model(model), "CPU", {
            "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})
        req = compiled.create_infer_request()
        names = [o.get_any_name() for o in compiled.outputs]

        def run():
            req.infer(feeds)
            return [req.get_output_tensor(i).data.copy() for i in range(len(names))]
    outs = run()
    ms, cpu = [], []
    for _ in range(runs):
        s, c = time.perf_counter(), time.process_time()
        run()
        ms.append((time.perf_counter() - s) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        for i, (n, o) in enumerate(zip(names, outs)):
            np.save(os.path.join(out_dir, f"out{i}.npy"), np.asarray(o))
    print(json.dumps({"ms": ms, "cpu_ms": cpu, "names": names}))


def run_json(argv, rss=None):
    """Runs argv and returns its JSON stdout. With `rss` (a list), appends the process's peak
    resident set in MB, as GNU time measures it: its own child's ru_maxrss. (os.wait4 on a direct
    child is no use: Linux carries the pre-exec high-water mark over exec, and a child forked
    from this process starts with this process's resident set, the loaded model included.)"""
    argv = [str(a) for a in argv]
    timed = rss is not None and os.path.exists("/usr/bin/time")
    if timed:
        argv = ["/usr/bin/time", "-f", "NNFUSE_PEAK_RSS_KB=%M"] + argv
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed: {r.stderr.strip()[-2000:]}")
    if rss is not None:
        kb = [line.split("=", 1)[1] for line in r.stderr.splitlines() if line.startswith("NNFUSE_PEAK_RSS_KB=")]
        rss.append(float(kb[-1]) / 1024.0 if timed and kb else math.nan)
    return json.loads(r.stdout)


def prepare(name, cli, workdir):
    """Writes the model and its inputs; returns (model path, [NAME=FILE], --shape args)."""
    path = os.path.join(workdir, f"{name}.onnx")
    shapes = {}
    from test_framework_exports import CASE_BUILDERS
    from long_seq_models import BUILDERS as LONG_BUILDERS
    if name in LONG_BUILDERS:
        model, feeds = LONG_BUILDERS[name]()
        onnx.save(model, path)
    elif name in CASE_BUILDERS:
        ec = CASE_BUILDERS[name]()
        onnx.save(ec.model, path)
        feeds, shapes = ec.feeds, ec.shapes
    else:
        if not os.path.exists(path):
            run_json([cli, "zoo", "export", name, "-o", path, "--json"])
        from test_zoo_ort import make_inputs
        feeds = make_inputs(onnx.load(path, load_external_data=False), "")
    inputs = []
    for i, (k, v) in enumerate(feeds.items()):
        f = os.path.join(workdir, f"{name}_in{i}.npy")
        np.save(f, v)
        inputs.append(f"{k}={f}")
    shape_args = []
    for k, dims in shapes.items():
        shape_args += ["--shape", f"{k}={','.join(map(str, dims))}"]
    return path, inputs, shape_args


def outputs_match(got_dir, want_dir, rtol, atol):
    """(ok, worst error / scale) of every out<i>.npy of got_dir against want_dir."""
    worst, ok = 0.0, True
    files = sorted(f for f in os.listdir(want_dir) if f.endswith(".npy"))
    for f in files:
        w = np.load(os.path.join(want_dir, f)).astype(np.float64)
        g = np.load(os.path.join(got_dir, f)).astype(np.float64)
        if g.shape != w.shape:
            return False, math.inf
        scale = max(float(np.abs(w).max(initial=0.0)), 1e-30)
        err = float(np.abs(g - w).max(initial=0.0))
        worst = max(worst, err / scale)
        ok = ok and err <= atol + rtol * scale
    return ok, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=DEFAULT_CLI)
    ap.add_argument("--models", default=",".join(ZOO_CNNS),
                    help="comma-separated zoo names or framework exports; groups: 'cnn-exports', 'zoo-cnns' (issue 21), "
                         "'seq-exports', 'zoo-seq' (transformers and LSTM, issue 22)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per process and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--workdir", default="/tmp/nnfuse_peers")
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes running while the engines are timed (a shared machine)")
    ap.add_argument("--no-profile", action="store_true", help="compile with --no-profile: the cost model picks conv algorithms (deterministic)")
    ap.add_argument("--child", nargs=4, metavar=("ENGINE", "MODEL", "THREADS", "RUNS"), help=argparse.SUPPRESS)
    ap.add_argument("--input", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]), a.input, a.out_dir)
    os.makedirs(a.workdir, exist_ok=True)
    names = []
    for n in a.models.split(","):
        names += GROUPS.get(n, [n])
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    for name in names:
        path, inputs, shape_args = prepare(name, a.cli, a.workdir)
        art = os.path.join(a.workdir, f"{name}.nnf")
        t0 = time.time()
        comp = run_json([a.cli, "compile", path, "-o", art, *(["--no-profile"] if a.no_profile else []), *shape_args, "--json"])
        compile_s = time.time() - t0
        in_args = [x for kv in inputs for x in ("--input", kv)]
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        try:
            time_model(a, name, path, inputs, in_args, art, threads, comp, compile_s, rows)
        finally:
            for b in busy:
                b.kill()
                b.wait()
    report(rows, threads, a.busy)


def time_model(a, name, path, inputs, in_args, art, threads, comp, compile_s, rows):
    """Times nnfuse, ORT and OpenVINO on one model at each thread count (interleaved rounds); appends a row each."""
    mem = comp["compile"]["memory"]
    for t in threads:
        res = {e: {"ms": [], "cpu": [], "rss": [], "round_ms": []} for e in ("nnfuse", "ort", "openvino")}
        outdirs = {e: os.path.join(a.workdir, f"{name}_t{t}_{e}") for e in res}
        for r in range(a.rounds):
            first = r == 0
            for e in res:
                if e == "nnfuse":
                    argv = [a.cli, "run", art, *in_args, "--threads", t, "--runs", a.runs + 1, "--json"]
                    if first:
                        argv += ["--outputs", outdirs[e]]
                    j = run_json(argv, res[e]["rss"])
                    # nnfuse run reports the median/min of its runs; its per-run list is not printed,
                    # so each round contributes its median (weighted by the run count).
                    res[e]["ms"] += [j["latency_ms"]["median"]] * a.runs
                    res[e]["round_ms"].append(j["latency_ms"]["median"])
                    res[e]["cpu"] += [j.get("cpu_ms", {}).get("median", math.nan)] * a.runs
                    if first:
                        # nnfuse names files by output; rename to out<i> in graph-output order.
                        for i, o in enumerate(j["outputs"]):
                            os.replace(o["file"], os.path.join(outdirs[e], f"out{i}.npy"))
                else:
                    argv = [sys.executable, os.path.abspath(__file__), "--child", e, path, t, a.runs,
                            *[f"--input={kv}" for kv in inputs]]
                    if first:
                        argv += ["--out-dir", outdirs[e]]
                    j = run_json(argv, res[e]["rss"])
                    res[e]["ms"] += j["ms"]
                    res[e]["round_ms"].append(float(np.median(j["ms"])))
                    res[e]["cpu"] += j["cpu_ms"]
        ok_n, err_n = outputs_match(outdirs["nnfuse"], outdirs["ort"], a.rtol, a.atol)
        ok_v, err_v = outputs_match(outdirs["openvino"], outdirs["ort"], a.rtol, a.atol)
        med = {e: float(np.median(v["ms"])) for e, v in res.items()}
        cpu = {e: float(np.median(v["cpu"])) for e, v in res.items()}
        # The best round (least per-process median): on a VM that slows whole processes at a time
        # (one process's runs all 1.4x slower than the next one's, for every engine alike) the
        # median over all runs depends on how many slow processes each engine drew.
        best = {e: min(v["round_ms"]) for e, v in res.items()}
        rows.append(dict(model=name, threads=t, **{f"{e}_ms": med[e] for e in med}, **{f"{e}_cpu": cpu[e] for e in cpu},
                         vs_ort=med["nnfuse"] / med["ort"], vs_ov=med["nnfuse"] / med["openvino"],
                         **{f"{e}_best_round_ms": best[e] for e in best},
                         vs_ort_best_round=best["nnfuse"] / best["ort"], vs_ov_best_round=best["nnfuse"] / best["openvino"],
                         ok_nnfuse=ok_n, err_nnfuse=err_n, ok_ov=ok_v, err_ov=err_v, fallback=mem["fallback_blocks"],
                         conv_algorithms=mem.get("conv_algorithms", {}).get("counts", {}), compile_s=compile_s,
                         **{f"{e}_rss_mb": max(v["rss"]) for e, v in res.items()}))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)


def report(rows, threads, busy):
    """Markdown tables and geomeans per thread count; fails when nnfuse's outputs differ from ORT's."""
    if busy:
        print(f"\n(timed with {busy} busy-loop process(es) running)")
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan
    for t in threads:
        sel = [r for r in rows if r["threads"] == t]
        print(f"\n### {t} thread(s)\n")
        print("| model | nnfuse ms | ORT ms | OpenVINO ms | nnfuse/ORT | nnfuse/OpenVINO | CPU ms/run nnfuse / ORT / OV "
              "| peak RSS MB nnfuse / ORT / OV | outputs vs ORT (nnfuse, OV) | fallback blocks | conv algorithms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sel:
            algos = ", ".join(f"{k} {v}" for k, v in sorted(r["conv_algorithms"].items()))
            print(f"| {r['model']} | {r['nnfuse_ms']:.3f} | {r['ort_ms']:.3f} | {r['openvino_ms']:.3f} | {r['vs_ort']:.2f} | "
                  f"{r['vs_ov']:.2f} | {r['nnfuse_cpu']:.2f} / {r['ort_cpu']:.2f} / {r['openvino_cpu']:.2f} | "
                  f"{r['nnfuse_rss_mb']:.0f} / {r['ort_rss_mb']:.0f} / {r['openvino_rss_mb']:.0f} | "
                  f"{'ok' if r['ok_nnfuse'] else 'MISMATCH'} {r['err_nnfuse']:.1e}, {'ok' if r['ok_ov'] else 'MISMATCH'} "
                  f"{r['err_ov']:.1e} | {r['fallback']} | {algos} |")
        print(f"\ngeomean at {t} thread(s): nnfuse/ORT {geo([r['vs_ort'] for r in sel]):.2f}, "
              f"nnfuse/OpenVINO {geo([r['vs_ov'] for r in sel]):.2f}")
        print(f"best round (each engine's least per-process median): "
              + ", ".join(f"{r['model']} {r['vs_ort_best_round']:.2f} / {r['vs_ov_best_round']:.2f}" for r in sel)
              + f"; geomean nnfuse/ORT {geo([r['vs_ort_best_round'] for r in sel]):.2f}, "
              f"nnfuse/OpenVINO {geo([r['vs_ov_best_round'] for r in sel]):.2f}")
    if any(not (r["ok_nnfuse"]) for r in rows):
        raise SystemExit("nnfuse outputs differ from ONNX Runtime's (see the table)")


if __name__ == "__main__":
    main()
