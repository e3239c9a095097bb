#!/usr/bin/env python3
"""Cold and warm `nnfuse compile` times per model, with the phases of a cold compile (issue 15).

Each model is compiled as a user compiles it (`nnfuse compile MODEL -o DIR`, conv algorithms timed
unless --no-profile; wall time of the whole process) three ways, one after the other:
  first       an empty kernel cache (a new $NNFUSE_CACHE_DIR): the first compile on a fresh machine,
              which also builds the precompiled support header and the conv timing program (both
              once per compiler, target and headers, then shared by every model);
  new model   an empty cache in which a tiny model (zoo resnet_tiny) was compiled first: a model
              not seen before on a machine that has compiled something (its kernels, and the
              timings of its conv shapes, are not in the cache);
  warm        the same cache again (every shared object and conv timing a cache hit).
Reports wall time per way and, for the new-model compile, its conv timing step, its kernel build
(compiling the generated units) and its generated stages against compiled implementations
(stages whose code differs only in their buffers share one, kernels/emit_cpp.cpp).

  python3 bench/compile_time.py --models zoo --workdir /tmp/ct
Prints a Markdown table. Models: zoo names (`nnfuse zoo export`) or the framework exports of the
test suite (tests/python/test_framework_exports.py); groups as in bench/peers.py plus 'zoo'.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peers import DEFAULT_CLI, GROUPS, ZOO_CNNS, ZOO_SEQ, prepare  # noqa: E402

# Every full-size zoo model.
GROUPS = dict(GROUPS, zoo=["resnet18", "resnet50", "mobilenetv2", "efficientnet_b0", "vgg16", "ssd_mobilenet", "bert_base", "gpt2",
                           "vit_b16", "lstm_seq2seq"])


def compile_once(cli, model, out, cache, shape_args, no_profile):
    env = dict(os.environ, NNFUSE_CACHE_DIR=cache)
    env.pop("NNFUSE_PCH_DIR", None)
    argv = [cli, "compile", model, "-o", out, "--json"] + shape_args + (["--no-profile"] if no_profile else [])
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"compile {model} failed: {r.stderr.strip()[-2000:]}")
    return wall, json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="zoo", help="comma-separated names or groups (zoo, zoo-cnns, zoo-seq, cnn-exports, seq-exports)")
    ap.add_argument("--cli", default=DEFAULT_CLI)
    ap.add_argument("--workdir", default=None, help="where models and artifacts go (default: a temp dir)")
    ap.add_argument("--no-profile", action="store_true", help="pass --no-profile (no conv timing)")
    args = ap.parse_args()
    names = []
    for m in args.models.split(","):
        names += GROUPS.get(m, [m])
    work = args.workdir or tempfile.mkdtemp(prefix="nnfuse_ct_")
    os.makedirs(work, exist_ok=True)
    rows = []
    tiny, _, tiny_shapes = prepare("resnet_tiny", args.cli, work)
    for name in names:
        path, _, shape_args = prepare(name, args.cli, work)
        cache = os.path.join(work, f"cache_{name}")
        shutil.rmtree(cache, ignore_errors=True)
        out = os.path.join(work, f"{name}.nnf")
        cold, rep = compile_once(args.cli, path, out, cache, shape_args, args.no_profile)
        shutil.rmtree(cache, ignore_errors=True)
        cache2 = cache + "_2"
        shutil.rmtree(cache2, ignore_errors=True)
        compile_once(args.cli, tiny, os.path.join(work, "tiny.nnf"), cache2, tiny_shapes, args.no_profile)
        cold_pch, rep2 = compile_once(args.cli, path, out, cache2, shape_args, args.no_profile)
        warm, rep3 = compile_once(args.cli, path, out, cache2, shape_args, args.no_profile)
        b = rep2["compile"]["build"]
        ct = b.get("conv_timing", {})
        rows.append((name, cold, cold_pch, warm, ct.get("ms", 0) / 1000, b["compile_ms"] / 1000, b.get("stages"), b.get("implementations"),
                     rep3["compile"]["build"]["cache_hit"]))
        shutil.rmtree(cache2, ignore_errors=True)
        print(f"{name}: first {cold:.1f} s, new model {cold_pch:.1f} s, warm {warm:.2f} s", file=sys.stderr)
    print("| model | first compile on the machine (s) | new model (s) | warm (s) | new model: conv timing (s) | new model: kernel build (s) "
          "| stages / compiled implementations |")
    print("|---|---|---|---|---|---|---|")
    for name, cold, cold_pch, warm, ct, kb, st, impl, hit in rows:
        print(f"| {name} | {cold:.1f} | {cold_pch:.1f} | {warm:.2f}{'' if hit else ' (miss!)'} | {ct:.1f} | {kb:.1f} | {st} / {impl} |")


if __name__ == "__main__":
    main()
