#!/usr/bin/env python3
"""Pipelines: which passes change the IR of which network class, and full vs class pipelines.

1. Exports every zoo model (tiny and full-size; transformers at opsets 13 and 17) and runs
   `nnfuse optimize MODEL --pipeline full --no-profile --json` on each, recording per pass whether
   it changed the IR (structural hash) and its time.
2. Aggregates per network class (the zoo's class): the passes that changed the IR of at least one
   model of the class. The derived class pipeline keeps those, in full's order, plus `rules-user`
   (user rules must always run) and `fusion-plan`. With --write the pipelines are written to
   rules/pipelines/<class>.pipeline.
3. Runs `--pipeline <class>` and `--pipeline auto` on every model and compares kernels and
   optimizer time (sum of pass ms and optimize_ms, fastest of --repeats interleaved runs) with full; with
   --latency and a compiled host target, also `nnfuse run --target host` latency for a few models.

Usage:
  python3 bench/pipelines.py [--cli build-x/bindings/nnfuse] [--write] [--repeats 3]
                             [--only resnet_tiny,bert_tiny] [--json-out results.json] [--md-out table.md]
  python3 bench/pipelines.py --latency-only [--latency all|tiny|full-size|ID,ID] [--latency-runs 20]
                             [--latency-runs-big 5] [--latency-rounds 3]
                             [--latency-rounds-big 3] [--latency-threads 1] [--json-out lat.json]
    (just export + `nnfuse run --target host` of full and the class pipeline, interleaved; wall and CPU ms)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMERS = {"transformer_encoder", "transformer_decoder"}
# rules-user (the user's rules) and fusion-plan always run. So do the cheap clean-up passes: under
# 1% of the pass time of every class, and real framework exports need them where the zoo's exports
# do not (PyTorch's Shape->Gather->Concat->Reshape chains: without shape-simplification a PyTorch
# encoder export keeps 14 kernels instead of 10; see docs/pipelines.md).
ALWAYS_KEEP = {"rules-user", "fusion-plan", "constant-folding", "shape-simplification", "dce"}
# A kept rule group whose fired rules are all implemented by a dedicated C++ pass runs as that pass
# instead, at the same place: `fold-batchnorm` folds Conv+BatchNormalization in one loop over the
# weight, where `bn-into-conv` builds and folds the Mul/Div/Sqrt/Reshape chain of its replacement
# with the reference kernels. The result is the same graph up to the names of the new weights
# (checked below: same blocks up to names, same weights).
EQUIVALENT_PASS = {"bn-into-conv": "fold-batchnorm", "bn-into-conv-bias": "fold-batchnorm"}


def sh(cmd: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def optimize(cli: str, model: Path, pipeline: str) -> dict:
    r = sh([cli, "optimize", str(model), "--pipeline", pipeline, "--no-profile", "--json"])
    if r.returncode != 0:
        raise RuntimeError(f"optimize {model} --pipeline {pipeline}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def pass_ms(rep: dict, key: str = "ms") -> float:
    return sum(p.get(key, 0.0) for p in rep["passes"])


def summarise(reps: list[dict]) -> dict:
    first = reps[0]
    return {
        "pipeline_name": first["pipeline_name"],
        "pipeline": first["pipeline"],
        "network_class": first["network_class"],
        "network_class_secondary": first.get("network_class_secondary"),
        "kernels": first["kernels"],
        "ops_after_rewrite": first["ops_after_rewrite"],
        "blocks": first["blocks"],
        # The minimum over the runs: on a shared machine, load only ever adds time, so the fastest
        # run is the best estimate of what the passes themselves cost.
        "pass_ms": min(pass_ms(r) for r in reps),
        "optimize_ms": min(r["optimize_ms"] for r in reps),
        # CPU time of the optimizing thread (user + system): other sessions' load on the shared
        # machine delays wall time but hardly this, so it is the steadier measure of work done.
        "pass_cpu_ms": min(pass_ms(r, "cpu_ms") for r in reps),
        "optimize_cpu_ms": min(r.get("optimize_cpu_ms", 0.0) for r in reps),
        # The medians too: the least run flatters a change whose cost comes in bursts (a pass whose
        # page faults are now and then much dearer, as huge pages were on this machine).
        "pass_cpu_ms_median": statistics.median(pass_ms(r, "cpu_ms") for r in reps),
        "optimize_cpu_ms_median": statistics.median(r.get("optimize_cpu_ms", 0.0) for r in reps),
        "passes": [{"name": p["name"], "changed": p["changed"],
                    "ms": min(r["passes"][i]["ms"] for r in reps),
                    "cpu_ms": min(r["passes"][i].get("cpu_ms", 0.0) for r in reps)} for i, p in enumerate(first["passes"])],
        "kernel_counts_stable": len({r["kernels"] for r in reps}) == 1,
        "rules_fired": first.get("rules_fired", {}),
    }


def canonical_blocks(blocks: list[dict]) -> list[dict]:
    """The fusion blocks with node and value names replaced by their order of first appearance: two
    pipelines that build the same graph but name a folded weight differently (`conv1.weight_bnfold`
    vs `bn-into-conv_const_rw0`) compare equal, any difference of ops, members or wiring does not."""
    ids: dict[str, str] = {}
    def c(name: str) -> str:
        return ids.setdefault(name, f"#{len(ids)}")
    out = []
    for b in blocks:
        out.append({k: ([c(x) for x in v] if k in ("inputs", "outputs") else c(v) if k == "anchor" else
                        [{mk: c(mv) if mk in ("name", "with") else mv for mk, mv in m.items()} for m in v] if k == "members" else v)
                    for k, v in b.items()})
    return out


def same_weights(cli: str, model: Path, pipelines: list[str], tmp: Path) -> bool:
    """Exports the rewritten model of each pipeline and compares the initializers: the same number,
    and per shape the same multiset of contents (names may differ), equal up to float rounding."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    sigs = []
    for i, p in enumerate(pipelines):
        out = tmp / f"rewritten_{i}.onnx"
        args = ["--pipeline-file", p] if p.endswith(".pipeline") else ["--pipeline", p]
        r = sh([cli, "optimize", str(model), *args, "--no-profile", "--export-rewritten", str(out)])
        if r.returncode != 0:
            raise RuntimeError(f"optimize {model} {p}: {r.stderr.strip()}")
        arrs = [numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer]
        out.unlink()
        sigs.append(sorted(arrs, key=lambda a: (a.shape, str(a.dtype), float(np.asarray(a, dtype=np.float64).sum()))))
    a, b = sigs[0], sigs[1]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype.kind == "f":
            if not np.allclose(x, y, rtol=1e-5, atol=1e-6):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def timed(cli: str, model: Path, pipeline: str, repeats: int) -> dict:
    return summarise([optimize(cli, model, pipeline) for _ in range(repeats)])


def timed_interleaved(cli: str, model: Path, pipelines: list[str], repeats: int) -> list[dict]:
    """Runs the pipelines in turn, `repeats` rounds, so load changes on a shared machine hit all alike."""
    reps: list[list[dict]] = [[] for _ in pipelines]
    for _ in range(repeats):
        for i, p in enumerate(pipelines):
            reps[i].append(optimize(cli, model, p))
    return [summarise(r) for r in reps]


def export_models(cli: str, cache: Path, only: set[str] | None) -> list[dict]:
    zoo = json.loads(sh([cli, "zoo", "list", "--json"]).stdout)
    zoo = zoo["models"] if isinstance(zoo, dict) else zoo
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for m in zoo:
        if only and m["name"] not in only:
            continue
        cls = m.get("network_class", m.get("class"))
        for opset in ([13, 17] if cls in TRANSFORMERS else [13]):
            path = cache / f"{m['name']}_op{opset}.onnx"
            if not path.exists():
                t0 = time.time()
                r = sh([cli, "zoo", "export", m["name"], "-o", str(path), "--opset", str(opset)])
                if r.returncode != 0:
                    raise RuntimeError(f"export {m['name']}: {r.stderr}")
                print(f"  exported {path.name} in {time.time() - t0:.1f} s", file=sys.stderr)
            out.append({"name": m["name"], "id": f"{m['name']}@{opset}", "opset": opset, "class": cls,
                        "tiny": bool(m.get("tiny")), "path": path})
    return out


def rule_groups() -> dict[str, str]:
    """Shipped rule name -> its pass (`rules-<group>`), from the `rule NAME:` lines of rules/*.rules."""
    out = {}
    for f in sorted((ROOT / "rules").glob("*.rules")):
        for line in f.read_text().splitlines():
            if line.startswith("rule "):
                out[line[5:].split(":")[0].strip()] = "rules-" + f.stem.replace("_", "-")
    return out


def derive(full_runs: dict, models: list[dict], full_order: list[str]) -> dict[str, dict]:
    """Per class: the passes to keep, and the arguments that narrow a kept pass to the part that fired:
    a rule group runs `only=` the rules that fired on some model of the class (a rule that never
    fired never changed the graph, so the remaining rules rewrite exactly as in `full`), and `cse`
    skips the half (equal initializers / equal nodes) that never merged anything on the class."""
    groups = rule_groups()
    by_class: dict[str, dict] = {}
    for m in models:
        c = by_class.setdefault(m["class"], {"models": [], "changed": {}, "fired": {}})
        c["models"].append(m["id"])
        for p in full_runs[m["id"]]["passes"]:
            c["changed"].setdefault(p["name"], [])
            if p["changed"]:
                c["changed"][p["name"]].append(m["id"])
        for rule, n in full_runs[m["id"]].get("rules_fired", {}).items():
            if n:
                c["fired"].setdefault(rule, []).append(m["id"])
    for cls, c in by_class.items():
        c["keep"] = [p for p in full_order if c["changed"].get(p) or p in ALWAYS_KEEP]
        c["args"] = {}
        for p in c["keep"]:
            if p.startswith("rules-") and p != "rules-user":
                c["args"][p] = "only=" + ",".join(r for r, g in groups.items() if g == p and r in c["fired"])
        if "cse" in c["keep"]:
            halves = [f"{h}=false" for h in ("initializers", "nodes") if f"cse-{h}" not in c["fired"]]
            if halves:
                c["args"]["cse"] = " ".join(halves)
        # A rule group whose fired rules a dedicated pass implements runs as that pass (EQUIVALENT_PASS).
        c["replaced"] = {}
        for p in list(c["args"]):
            fired = c["args"][p][len("only="):].split(",") if c["args"][p].startswith("only=") else []
            targets = {EQUIVALENT_PASS.get(r) for r in fired}
            if fired and len(targets) == 1 and None not in targets:
                (target,) = targets
                c["keep"][c["keep"].index(p)] = target
                del c["args"][p]
                c["replaced"][p] = target
    return by_class


def write_pipeline(cls: str, c: dict, full_order: list[str]) -> None:
    lines = [f"# Pipeline for the {cls} class (chosen by --pipeline auto), derived by bench/pipelines.py:",
             "# the passes of `full` that changed the IR of at least one zoo model of the class, in full's",
             "# order, plus rules-user (user rules always run), fusion-plan, and the cheap clean-up passes",
             "# (constant-folding, shape-simplification, dce) that real framework exports need. A rule group",
             "# runs only= the rules that fired on the class; cse skips the half that never merged anything;",
             "# a rule group whose fired rules a dedicated pass implements runs as that pass (bn-into-conv:",
             "# fold-batchnorm), giving the same graph up to the new weights' names.",
             "# docs/pipelines.md has the measured tables.",
             f"# Measured on: {', '.join(c['models'])}.",
             f"pipeline {cls}", f"class {cls}",
             f"description {cls}: {len(c['keep'])} of {len(full_order)} passes of full"]
    dropped = [p for p in full_order if p not in c["keep"] and p not in c["replaced"]]
    lines.append(f"# dropped (no IR change on any model of the class): {', '.join(dropped) or 'none'}")
    for p, target in c["replaced"].items():
        lines.append(f"# {p}: only rules that {target} implements fired on the class, so {target} runs in its place")
    lines += [f"pass {p} {c['args'][p]}" if p in c["args"] else f"pass {p}" for p in c["keep"]]
    (ROOT / "rules" / "pipelines" / f"{cls}.pipeline").write_text("\n".join(lines) + "\n")


def latency(cli: str, model: Path, pipeline: str, runs: int, threads: int | None = None) -> float | None:
    try:
        return run_host(cli, model, pipeline, runs, threads)["latency_ms"]
    except RuntimeError:
        return None


def run_host(cli: str, model: Path, pipeline: str, runs: int, threads: int | None) -> dict:
    """One `nnfuse run --target host` process: the median wall latency and the median process CPU time
    per run (cpu_ms: user + system of the whole process, so all its threads), its kernels and the
    hash of its compiled kernels (equal hashes: the very same code, so any latency gap is noise)."""
    r = sh([cli, "run", str(model), "--target", "host", "--pipeline", pipeline, "--no-profile", "--seed", "0",
            "--runs", str(runs), *(["--threads", str(threads)] if threads is not None else []), "--json"], timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"run {model} --pipeline {pipeline}: {r.stderr.strip()}")
    d = json.loads(r.stdout)
    build = d.get("compile", {}).get("build", {})
    return {"latency_ms": d["latency_ms"]["median"], "cpu_ms": d["cpu_ms"]["median"], "kernels": d["kernels"],
            "hash": build.get("hash"), "cache_hit": build.get("cache_hit"), "threads_used": d.get("threads_used")}


def latency_interleaved(cli: str, model: Path, pipelines: list[str], runs: int, rounds: int, threads: int) -> list[dict]:
    """`rounds` rounds of one `nnfuse run --runs RUNS` process per pipeline, in turn (ABAB), so load
    changes on a shared machine hit every pipeline alike; per pipeline the median over the rounds of
    each process's median wall latency and CPU time."""
    per: list[list[dict]] = [[] for _ in pipelines]
    for _ in range(rounds):
        for i, p in enumerate(pipelines):
            per[i].append(run_host(cli, model, p, runs, threads))
    out = []
    for p, rs in zip(pipelines, per):
        out.append({"pipeline": p, "kernels": rs[0]["kernels"], "hash": rs[0]["hash"],
                    "latency_ms": statistics.median(r["latency_ms"] for r in rs),
                    "cpu_ms": statistics.median(r["cpu_ms"] for r in rs),
                    # The fastest process: on a shared machine a process's speed can shift as a whole
                    # (neighbours' load), so the fastest round is the other estimate of the code's own speed.
                    "latency_ms_min": min(r["latency_ms"] for r in rs), "cpu_ms_min": min(r["cpu_ms"] for r in rs),
                    "latency_ms_rounds": [r["latency_ms"] for r in rs], "cpu_ms_rounds": [r["cpu_ms"] for r in rs],
                    "cache_hits": [r["cache_hit"] for r in rs], "threads_used": rs[0]["threads_used"]})
    return out


def latency_selected(spec: str, m: dict) -> bool:
    """--latency: `all`, `tiny`, `full-size`, or comma-separated model ids (name@opset)."""
    if spec == "all":
        return True
    if spec in ("tiny", "full-size"):
        return m["tiny"] == (spec == "tiny")
    return m["id"] in spec.split(",")


def latency_only(a, models: list[dict]) -> int:
    """--latency-only: export + latency of full vs the class pipeline, nothing else (no optimizer timing,
    no weight check). Tiny models first, so a run cut short still has results; the JSON is rewritten
    after every model."""
    threads = a.latency_threads if a.latency_threads is not None else 1
    rows = []
    todo = sorted((m for m in models if latency_selected(a.latency or "all", m)), key=lambda m: not m["tiny"])
    for m in todo:
        cls_pipe = m["class"] if m["class"] != "generic" else "full"
        runs = a.latency_runs if m["tiny"] else (a.latency_runs_big or a.latency_runs)
        rounds = a.latency_rounds if m["tiny"] else (a.latency_rounds_big or a.latency_rounds)
        t0 = time.time()
        f, c = latency_interleaved(a.cli, m["path"], ["full", cls_pipe], runs, rounds, threads)
        row = {"id": m["id"], "class": m["class"], "tiny": m["tiny"], "class_pipeline": cls_pipe, "runs": runs,
               "rounds": rounds, "threads": threads, "threads_used": f["threads_used"],
               "kernels_full": f["kernels"], "kernels_class": c["kernels"], "same_kernel_code": f["hash"] == c["hash"],
               "hash_full": f["hash"], "hash_class": c["hash"],
               "latency_ms_full": f["latency_ms"], "latency_ms_class": c["latency_ms"],
               "cpu_ms_full": f["cpu_ms"], "cpu_ms_class": c["cpu_ms"],
               "latency_ratio": c["latency_ms"] / f["latency_ms"] if f["latency_ms"] else None,
               "cpu_ratio": c["cpu_ms"] / f["cpu_ms"] if f["cpu_ms"] else None,
               "latency_ms_min_full": f["latency_ms_min"], "latency_ms_min_class": c["latency_ms_min"],
               "cpu_ms_min_full": f["cpu_ms_min"], "cpu_ms_min_class": c["cpu_ms_min"],
               "cpu_ratio_min": c["cpu_ms_min"] / f["cpu_ms_min"] if f["cpu_ms_min"] else None,
               # The median of the per-round ratios: the machine runs in slower phases lasting minutes that
               # hit a round's full and class processes alike, so pairing each round cancels them where the
               # per-pipeline medians can land in different phases.
               "latency_ratio_paired": statistics.median(y / x for x, y in zip(f["latency_ms_rounds"], c["latency_ms_rounds"]) if x),
               "cpu_ratio_paired": statistics.median(y / x for x, y in zip(f["cpu_ms_rounds"], c["cpu_ms_rounds"]) if x),
               "latency_ms_rounds_full": f["latency_ms_rounds"], "latency_ms_rounds_class": c["latency_ms_rounds"],
               "cpu_ms_rounds_full": f["cpu_ms_rounds"], "cpu_ms_rounds_class": c["cpu_ms_rounds"],
               "cache_hits_full": f["cache_hits"], "cache_hits_class": c["cache_hits"], "seconds": time.time() - t0}
        rows.append(row)
        print(f"  {m['id']:24s} kernels {f['kernels']}/{c['kernels']}  wall ms {f['latency_ms']:.3f} / {c['latency_ms']:.3f} "
              f"(x{row['latency_ratio']:.3f})  cpu ms {f['cpu_ms']:.3f} / {c['cpu_ms']:.3f} (x{row['cpu_ratio']:.3f})  "
              f"paired wall x{row['latency_ratio_paired']:.3f} cpu x{row['cpu_ratio_paired']:.3f}  same code {row['same_kernel_code']}  {row['seconds']:.0f} s", file=sys.stderr, flush=True)
        if a.json_out:
            Path(a.json_out).write_text(json.dumps({"latency": rows}, indent=1, default=str))
    md = render_latency(rows)
    print(md)
    if a.md_out:
        Path(a.md_out).write_text(md)
    return 0


def render_latency(rows: list[dict]) -> str:
    out = ["### Latency, full vs class pipeline (`nnfuse run --target host`; medians over the interleaved rounds of each process's median)\n",
           "| model@opset | class pipeline | kernels full / class | same kernel code | runs x rounds | wall ms full / class | class/full wall | "
           "CPU ms full / class | class/full CPU | fastest round CPU ms full / class | class/full | "
           "paired class/full wall / CPU |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['id']} | {r['class_pipeline']} | {r['kernels_full']} / {r['kernels_class']} | "
                   f"{'yes' if r['same_kernel_code'] else 'NO'} | {r['runs']} x {r['rounds']} | "
                   f"{r['latency_ms_full']:.3f} / {r['latency_ms_class']:.3f} | {r['latency_ratio']:.3f} | "
                   f"{r['cpu_ms_full']:.3f} / {r['cpu_ms_class']:.3f} | {r['cpu_ratio']:.3f} | "
                   f"{r['cpu_ms_min_full']:.3f} / {r['cpu_ms_min_class']:.3f} | {r['cpu_ratio_min']:.3f} | "
                   f"{r['latency_ratio_paired']:.3f} / {r['cpu_ratio_paired']:.3f} |")
    if rows:
        lr = [r["latency_ratio"] for r in rows]
        cr = [r["cpu_ratio"] for r in rows]
        worst_l = max(rows, key=lambda r: r["latency_ratio"])
        worst_c = max(rows, key=lambda r: r["cpu_ratio"])
        slow = [r["id"] for r in rows if r["cpu_ratio"] > 1.02 or r["cpu_ratio_paired"] > 1.02]
        mr = [r["cpu_ratio_min"] for r in rows]
        pl = [r["latency_ratio_paired"] for r in rows]
        pc = [r["cpu_ratio_paired"] for r in rows]
        out.append("")
        out.append(f"{len(rows)} models. class/full wall latency: mean {statistics.mean(lr):.3f}, worst {worst_l['latency_ratio']:.3f} "
                   f"({worst_l['id']}); CPU time: mean {statistics.mean(cr):.3f}, worst {worst_c['cpu_ratio']:.3f} ({worst_c['id']}); "
                   f"fastest-round CPU time: mean {statistics.mean(mr):.3f}, worst {max(mr):.3f}; median per-round ratio, wall: mean "
                   f"{statistics.mean(pl):.3f}, worst {max(pl):.3f}; CPU: mean {statistics.mean(pc):.3f}, worst {max(pc):.3f} "
                   f"({max(rows, key=lambda r: r['cpu_ratio_paired'])['id']}). "
                   f"Class more than 2% slower on CPU time (medians or paired): {', '.join(slow) or 'none'}. "
                   f"Models whose class and full kernels differ in code: {', '.join(r['id'] for r in rows if not r['same_kernel_code']) or 'none'}.")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default=os.environ.get("NNFUSE_CLI", str(ROOT / "build" / "bindings" / "nnfuse")))
    ap.add_argument("--cache", default="/tmp/nnfuse_pipeline_models")
    ap.add_argument("--only", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the derived rules/pipelines/<class>.pipeline files")
    ap.add_argument("--latency", default="",
                    help="models to time with nnfuse run --target host: comma-separated ids (name@opset), all, tiny or full-size")
    ap.add_argument("--latency-runs", type=int, default=10)
    ap.add_argument("--latency-only", action="store_true",
                    help="export and time full vs the class pipeline with nnfuse run only (wall and CPU ms, interleaved "
                         "rounds); no optimizer timing, no weight check. Models: --latency (default all)")
    ap.add_argument("--latency-rounds", type=int, default=3, help="--latency-only: interleaved full/class rounds")
    ap.add_argument("--latency-runs-big", type=int, default=0, help="--latency-only: --runs for full-size models (default --latency-runs)")
    ap.add_argument("--latency-rounds-big", type=int, default=0,
                    help="--latency-only: rounds for full-size models (default --latency-rounds)")
    ap.add_argument("--latency-threads", type=int, default=None,
                    help="--threads of nnfuse run (default: 1 with --latency-only, else the CLI's default)")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--no-weight-check", action="store_true",
                    help="skip exporting the rewritten model of full and of the class pipeline to compare their weights")
    ap.add_argument("--md-out", default="")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    full_order = [l.split()[1] for l in (ROOT / "rules/pipelines/full.pipeline").read_text().splitlines()
                  if l.strip().startswith("pass ")]

    models = export_models(a.cli, Path(a.cache), only)
    if a.latency_only:
        return latency_only(a, models)
    full_runs = {}
    for m in models:
        full_runs[m["id"]] = timed(a.cli, m["path"], "full", 1)  # which passes change the IR (deterministic)
        print(f"  full  {m['id']:24s} kernels {full_runs[m['id']]['kernels']:5d}  {full_runs[m['id']]['pass_ms']:9.1f} ms", file=sys.stderr)
    by_class = derive(full_runs, models, full_order)
    if a.write:
        for cls, c in by_class.items():
            if cls != "generic":  # generic runs full
                write_pipeline(cls, c, full_order)

    rows = []
    full_timed = {}
    for m in models:
        cls_pipe = m["class"] if m["class"] != "generic" else "full"
        f, c, au = timed_interleaved(a.cli, m["path"], ["full", cls_pipe, "auto"], a.repeats)
        full_timed[m["id"]] = f
        row = {"id": m["id"], "class": m["class"], "tiny": m["tiny"], "classified": f["network_class"],
               "secondary": f["network_class_secondary"], "auto_pipeline": au["pipeline_name"],
               "kernels_full": f["kernels"], "kernels_class": c["kernels"], "kernels_auto": au["kernels"],
               "pass_ms_full": f["pass_ms"], "pass_ms_class": c["pass_ms"], "pass_ms_auto": au["pass_ms"],
               "optimize_ms_full": f["optimize_ms"], "optimize_ms_class": c["optimize_ms"], "optimize_ms_auto": au["optimize_ms"],
               "pass_cpu_ms_full": f["pass_cpu_ms"], "pass_cpu_ms_class": c["pass_cpu_ms"], "pass_cpu_ms_auto": au["pass_cpu_ms"],
               "optimize_cpu_ms_full": f["optimize_cpu_ms"], "optimize_cpu_ms_class": c["optimize_cpu_ms"],
               "optimize_cpu_ms_auto": au["optimize_cpu_ms"],
               **{f"{k}_median_{tag}": run[f"{k}_median"] for k in ("pass_cpu_ms", "optimize_cpu_ms")
                  for tag, run in (("full", f), ("class", c), ("auto", au))},
               # Dropping only passes that changed nothing (or running an equivalent pass) must leave
               # the very same fusion blocks, up to the names of new weights.
               "same_blocks_class": canonical_blocks(c["blocks"]) == canonical_blocks(f["blocks"]),
               "same_blocks_auto": canonical_blocks(au["blocks"]) == canonical_blocks(f["blocks"]),
               "same_names_class": c["blocks"] == f["blocks"]}
        if not a.no_weight_check:
            with tempfile.TemporaryDirectory() as tmp:
                row["same_weights_class"] = same_weights(a.cli, m["path"], ["full", cls_pipe], Path(tmp))
        if a.latency and latency_selected(a.latency, m):
            row["latency_ms_full"] = latency(a.cli, m["path"], "full", a.latency_runs, a.latency_threads)
            row["latency_ms_class"] = latency(a.cli, m["path"], cls_pipe, a.latency_runs, a.latency_threads)
        rows.append(row)
        print(f"  {m['id']:24s} kernels full {f['kernels']} class {c['kernels']} auto {au['kernels']}  "
              f"pass ms {f['pass_ms']:.1f} -> {c['pass_ms']:.1f}  optimize ms {f['optimize_ms']:.1f} -> {c['optimize_ms']:.1f}",
              file=sys.stderr)

    md = render(by_class, full_timed, rows, full_order, a)
    print(md)
    if a.md_out:
        Path(a.md_out).write_text(md)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"full": full_runs, "classes": by_class, "rows": rows}, indent=1, default=str))
    worse = [r["id"] for r in rows if r["kernels_class"] > r["kernels_full"] or r["kernels_auto"] > r["kernels_full"]]
    if worse:
        print(f"MORE KERNELS THAN FULL: {worse}", file=sys.stderr)
        return 1
    return 0


def render(by_class, full_runs, rows, full_order, a) -> str:
    out = []
    short = {p: p for p in full_order}
    out.append("### Passes that changed the IR under `full` (models of the class that the pass changed / models)\n")
    classes = sorted(by_class)
    out.append("| pass | " + " | ".join(classes) + " |")
    out.append("|---|" + "---|" * len(classes))
    for p in full_order:
        cells = []
        for cls in classes:
            c = by_class[cls]
            n = len(c["changed"].get(p, []))
            mark = f"as {c['replaced'][p]}" if p in c["replaced"] else "kept" if p in c["keep"] else "dropped"
            cells.append(f"{n}/{len(c['models'])} {mark}")
        out.append(f"| {short[p]} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("### Arguments that narrow a kept pass (rules that fired on the class; cse halves that merged nothing)\n")
    out.append("| class | pass arguments in the class pipeline |")
    out.append("|---|---|")
    for cls in classes:
        args = by_class[cls].get("args", {})
        cell = "; ".join(f"`{p} {v}`" for p, v in args.items()) if cls != "generic" else "(runs full)"
        out.append(f"| {cls} | {cell or '-'} |")
    out.append("")
    out.append("### Per pass CPU time under `full` (ms, least of the runs; summed over the models of the class)\n")
    out.append("| pass | " + " | ".join(classes) + " |")
    out.append("|---|" + "---|" * len(classes))
    for p in full_order:
        cells = []
        for cls in classes:
            tot = sum(pp["cpu_ms"] for mid in by_class[cls]["models"] for pp in full_runs[mid]["passes"] if pp["name"] == p)
            cells.append(f"{tot:.2f}")
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("### Full vs class pipeline per model\n")
    lat = any("latency_ms_full" in r for r in rows)
    hdr = ("| model@opset | class (classified) | auto pipeline | kernels full / class / auto | same blocks | pass ms full / class (saved) | "
           "optimize_ms full / class (saved) | pass CPU ms full / class (saved) | optimize CPU ms full / class (saved) |")
    if lat:
        hdr += " latency ms full / class |"
    out.append(hdr)
    out.append("|---|---|---|---|---|---|---|---|---|" + ("---|" if lat else ""))
    def same_cell(r):
        if not (r["same_blocks_class"] and r["same_blocks_auto"]) or r.get("same_weights_class") is False:
            return "NO"
        return ("yes" if r["same_names_class"] else "yes (weights renamed)") + ("" if "same_weights_class" in r else ", weights unchecked")
    for r in rows:
        cl = r["classified"] + (f"+{r['secondary']}" if r["secondary"] else "")
        def cell(key):
            f, c = r[f"{key}_full"], r[f"{key}_class"]
            return f"{f:.1f} / {c:.1f} ({100 * (1 - c / f) if f else 0:.0f}%)"
        line = (f"| {r['id']} | {r['class']} ({cl}) | {r['auto_pipeline']} | {r['kernels_full']} / {r['kernels_class']} / {r['kernels_auto']} | "
                f"{same_cell(r)} | "
                + " | ".join(cell(k) for k in ("pass_ms", "optimize_ms", "pass_cpu_ms", "optimize_cpu_ms")) + " |")
        if lat:
            lf, lc = r.get("latency_ms_full"), r.get("latency_ms_class")
            line += f" {lf:.3f} / {lc:.3f} |" if lf is not None and lc is not None else " - |"
        out.append(line)
    def mean_saving(key):
        vals = [1 - r[f"{key}_class"] / r[f"{key}_full"] for r in rows if r[f"{key}_full"] > 0]
        return 100 * sum(vals) / len(vals) if vals else 0.0
    def mean_saving_auto(key):
        vals = [1 - r[f"{key}_auto"] / r[f"{key}_full"] for r in rows if r[f"{key}_full"] > 0]
        return 100 * sum(vals) / len(vals) if vals else 0.0
    def mean_saving_median(key, tag="class"):
        vals = [1 - r[f"{key}_median_{tag}"] / r[f"{key}_median_full"] for r in rows if r.get(f"{key}_median_full")]
        return 100 * sum(vals) / len(vals) if vals else 0.0
    nonfull = [r for r in rows if r["class"] != "generic"]
    generic = [r for r in rows if r["class"] == "generic"]
    out.append("")
    out.append(f"Mean saving over {len(rows)} models (class pipeline vs full): pass time {mean_saving('pass_ms'):.0f}%, "
               f"optimize_ms {mean_saving('optimize_ms'):.0f}%, pass CPU time {mean_saving('pass_cpu_ms'):.0f}%, "
               f"optimize CPU time {mean_saving('optimize_cpu_ms'):.0f}%; with --pipeline auto: pass time {mean_saving_auto('pass_ms'):.0f}%, "
               f"optimize_ms {mean_saving_auto('optimize_ms'):.0f}%, pass CPU time {mean_saving_auto('pass_cpu_ms'):.0f}%, "
               f"optimize CPU time {mean_saving_auto('optimize_cpu_ms'):.0f}%. "
               f"From the medians of the runs instead of the least: pass CPU time {mean_saving_median('pass_cpu_ms'):.1f}%, "
               f"optimize CPU time {mean_saving_median('optimize_cpu_ms'):.1f}% (auto: {mean_saving_median('pass_cpu_ms', 'auto'):.1f}%, "
               f"{mean_saving_median('optimize_cpu_ms', 'auto'):.1f}%). "
               f"Total pass time: full {sum(r['pass_ms_full'] for r in rows):.0f} ms, class {sum(r['pass_ms_class'] for r in rows):.0f} ms. "
               f"Models with more kernels than full: {sum(r['kernels_class'] > r['kernels_full'] for r in rows)} (class), "
               f"{sum(r['kernels_auto'] > r['kernels_full'] for r in rows)} (auto); models whose fusion blocks differ from full's: "
               f"{sum(not (r['same_blocks_class'] and r['same_blocks_auto']) for r in rows)}; whose weights differ: "
               f"{sum(r.get('same_weights_class') is False for r in rows)} (of {sum('same_weights_class' in r for r in rows)} checked). {len(nonfull)} models have a class "
               f"pipeline; the generic ones ({', '.join(r['id'] for r in generic)}) run full both times, so their 'saving' is the noise "
               f"of the measurement on this machine.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
