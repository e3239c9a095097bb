#!/usr/bin/env python3
"""Cold and warm `nnfuse compile` times per model, with the phases of a cold compile (issue 15).

Each model is compiled as a user compiles it (`nnfuse compile MODEL -o DIR`, conv algorithms timed
unless --no-profile) three ways, one after the other:
  cold        an empty kernel cache (a new $NNFUSE_CACHE_DIR), precompiled support header included:
              what a first compile on a fresh machine costs;
  cold, PCH   an empty kernel cache, but the precompiled support header already built (it is built
              once per compiler, flags and header contents, shared by every model and cache);
  warm        the same cache again (every shared object and conv timing a cache hit).
Reports wall time per way and, for the cold compile, the conv timing step (compiling the timing
program and running it), the kernel build (compiling the generated units) and the number of
generated stages against the number of compiled implementations (stages whose code differs only
in their buffers share one, kernels/emit_cpp.cpp).

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

GROUPS = dict(GROUPS, zoo=ZOO_CNNS + ZOO_SEQ)


def compile_once(cli, model, out, cache, pch, shape_args, no_profile):
    env = dict(os.environ, NNFUSE_CACHE_DIR=cache)
    if pch:
        env["NNFUSE_PCH_DIR"] = pch
    else:
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
    for name in names:
        path, _, shape_args = prepare(name, args.cli, work)
        cache = os.path.join(work, f"cache_{name}")
        shutil.rmtree(cache, ignore_errors=True)
        out = os.path.join(work, f"{name}.nnf")
        cold, rep = compile_once(args.cli, path, out, cache, None, shape_args, args.no_profile)
        pch = os.path.join(cache, "pch")  # the PCH that cold compile built, for the next way
        cache2 = cache + "_2"
        shutil.rmtree(cache2, ignore_errors=True)
        cold_pch, rep2 = compile_once(args.cli, path, out, cache2, pch, shape_args, args.no_profile)
        warm, rep3 = compile_once(args.cli, path, out, cache2, pch, shape_args, args.no_profile)
        b = rep2["compile"]["build"]
        ct = b.get("conv_timing", {})
        rows.append((name, cold, cold_pch, warm, ct.get("ms", 0) / 1000, b["compile_ms"] / 1000, b.get("stages"), b.get("implementations"),
                     rep3["compile"]["build"]["cache_hit"]))
        shutil.rmtree(cache2, ignore_errors=True)
        print(f"{name}: cold {cold:.1f} s, cold with PCH {cold_pch:.1f} s, warm {warm:.2f} s", file=sys.stderr)
    print("| model | cold (s) | cold, PCH built (s) | warm (s) | conv timing (s) | kernel build (s) | stages / compiled implementations |")
    print("|---|---|---|---|---|---|---|")
    for name, cold, cold_pch, warm, ct, kb, st, impl, hit in rows:
        print(f"| {name} | {cold:.1f} | {cold_pch:.1f} | {warm:.2f}{'' if hit else ' (miss!)'} | {ct:.1f} | {kb:.1f} | {st} / {impl} |")


if __name__ == "__main__":
    main()
