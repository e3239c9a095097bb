"""Every zoo model, in every exported form, against ONNX Runtime.

For each model listed by `nnfuse zoo list` and each form (opsets 13, 17 and 20 for transformers,
13 for the others and for the full-size transformers) the test exports it with `nnfuse zoo export`, checks the file with
onnx.checker (full_check, which runs ONNX's shape inference too), runs the same seeded random
inputs through ONNX Runtime and through `nnfuse run --target reference --pipeline none`, and
compares them; then it round-trips the export through `nnfuse convert` and checks that ONNX
Runtime gives the converted model the same outputs as the original.

Budget: the tiny models always run. Full-size models run at batch 1 with their default sequence
lengths; those in SLOW_MODELS (VGG-16, BERT-base, GPT-2, ViT-B/16, the big LSTM: ~20 s just to
export each form) only run with NNFUSE_TEST_FULL=1. See docs/conformance.md for measured times.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import assert_cuda_kernels_fit, assert_close, cli_path

RTOL, ATOL = 1e-4, 1e-5

# Per-model looser bounds for the reference-vs-ORT comparison, with the reason.
MODEL_TOLERANCES: dict[str, tuple[float, float, str]] = {
    # 81 float32 conv/BN/SiLU/SE layers; ORT's MLAS kernels sum in a different order (FMA,
    # blocked K). Logits reach |20|, and the few near-zero ones carry ~6e-5 of absolute rounding
    # (3e-6 of the output range), so the absolute bound is 1e-4.
    "efficientnet_b0": (1e-4, 1e-4, "deep float32 network: summation-order rounding on near-zero logits"),
}

# Full-size models whose export alone takes ~20 s (100M+ random weights), with the checker and
# ONNX Runtime sessions about a minute per form: with 3 opsets per transformer they would take
# the file past a 10-minute CI budget on 2 cores, so every step on them needs NNFUSE_TEST_FULL=1.
# The other full-size models (ResNet-18/50, MobileNetV2, EfficientNet-B0, SSD-MobileNet) run
# every time: the reference interpreter takes 0.6-3.5 s on each.
SLOW_MODELS = {"vgg16", "bert_base", "gpt2", "vit_b16", "lstm_seq2seq"}
FULL = os.environ.get("NNFUSE_TEST_FULL") == "1"

TRANSFORMER_CLASSES = {"transformer_encoder", "transformer_decoder"}


def _zoo_list() -> list[dict]:
    p = cli_path()
    if not (p.is_file() and os.access(p, os.X_OK)):
        return []
    r = subprocess.run([str(p), "zoo", "list", "--json"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return []
    data = json.loads(r.stdout)
    models = data["models"] if isinstance(data, dict) else data
    out = []
    for m in models:
        out.append({
            "name": m["name"],
            "network_class": m.get("network_class", m.get("class", "generic")),
            "tiny": bool(m.get("tiny", False)),
            "description": m.get("description", ""),
        })
    return out


def _cases():
    models = _zoo_list()
    if not models:
        # Collected anyway so the run fails with the fixture's clear message instead of
        # silently testing nothing.
        return [pytest.param(None, 13, id="zoo-unavailable")]
    cases = []
    for m in models:
        opsets = [13, 17, 20] if m["network_class"] in TRANSFORMER_CLASSES else [13]
        if m["name"] in SLOW_MODELS:
            # The 100M-parameter transformers in their opset-13 form only: the opset-17 and -20
            # forms differ from it in the ops the exporter writes (LayerNormalization, Split's
            # input), which the tiny forms of the same models check at every opset; each
            # full-size form costs CI about 30 s.
            opsets = [13]
        for opset in opsets:
            marks = []
            if not m["tiny"]:
                marks.append(pytest.mark.full_size)
            if m["name"] in SLOW_MODELS:
                marks.append(pytest.mark.skipif(not FULL, reason="large full-size model: set NNFUSE_TEST_FULL=1"))
            cases.append(pytest.param(m, opset, id=f"{m['name']}-opset{opset}", marks=marks))
    return cases


CASES = _cases()


def _export(cli, export_cache, model: dict, opset: int) -> Path:
    key = (model["name"], opset)
    if key not in export_cache["files"]:
        path = export_cache["dir"] / f"{model['name']}_opset{opset}.onnx"
        rep = cli.ok("zoo", "export", model["name"], "-o", path, "--opset", opset)
        assert path.is_file(), f"zoo export reported success but wrote no {path}: {rep}"
        export_cache["files"][key] = path
    return export_cache["files"][key]


def _np_dtype(elem_type: int):
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def _vocab_of(model: onnx.ModelProto, input_name: str, fallback: int) -> int:
    """Rows of the embedding table an integer input indexes (Gather(table, ids))."""
    inits = {i.name: i for i in model.graph.initializer}
    consts = {}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = a.t
    # Follow Cast/Identity/Reshape of the ids down to a Gather.
    names = {input_name}
    changed = True
    while changed:
        changed = False
        for n in model.graph.node:
            if n.op_type in ("Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Transpose") and n.input and n.input[0] in names:
                if n.output[0] not in names:
                    names.add(n.output[0])
                    changed = True
    best = None
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] in names:
            table = inits.get(n.input[0]) or consts.get(n.input[0])
            if table is not None and len(table.dims) >= 1:
                best = int(table.dims[0]) if best is None else min(best, int(table.dims[0]))
    return best or fallback


def make_inputs(model: onnx.ModelProto, description: str = "", seed: int = 0,
                symbols: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs: floats N(0,1); int ids uniform in the vocab; attention masks ones with
    trailing zeros on the first row. `symbols` gives the sizes of symbolic dims."""
    rng = np.random.default_rng(seed)
    init_names = {i.name for i in model.graph.initializer}
    m = re.search(r"vocab (\d+)", description)
    vocab_hint = int(m.group(1)) if m else 100
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                assert symbols and d.dim_param in symbols, f"input {vi.name}: no size for symbolic dim '{d.dim_param}'"
                shape.append(symbols[d.dim_param])
        dt = _np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        elif "mask" in vi.name:
            mask = np.ones(shape, dtype=dt)
            if len(shape) == 2 and shape[1] > 4:
                mask[0, -max(1, shape[1] // 4):] = 0  # padded tail of the first sequence
            feeds[vi.name] = mask
        elif np.issubdtype(dt, np.integer):
            vocab = _vocab_of(model, vi.name, vocab_hint)
            feeds[vi.name] = rng.integers(0, vocab, size=shape).astype(dt)
        elif dt == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            raise AssertionError(f"no input generator for {vi.name} ({dt})")
    return feeds


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _need(model):
    if model is None:
        p = cli_path()
        pytest.fail(f"`nnfuse zoo list --json` gave no models (CLI at {p}); build the nnfuse target or set "
                    f"NNFUSE_CLI", pytrace=False)


@pytest.mark.parametrize("model,opset", CASES)
def test_zoo_export_passes_onnx_checker(cli, export_cache, model, opset):
    _need(model)
    path = _export(cli, export_cache, model, opset)
    onnx.checker.check_model(str(path), full_check=True)
    m = onnx.load(str(path))
    default = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")]
    assert default == [opset], f"exported opset_import {default}, asked for {opset}"


@pytest.mark.parametrize("model,opset", CASES)
def test_zoo_reference_matches_ort(cli, export_cache, workdir, model, opset):
    _need(model)
    path = _export(cli, export_cache, model, opset)
    m = onnx.load(str(path), load_external_data=False)
    feeds = make_inputs(m, model["description"])
    want = run_ort(path, feeds)
    t0 = time.monotonic()
    got = cli.run_model(path, feeds, workdir)
    print(f"\n{model['name']} opset {opset}: reference run {time.monotonic() - t0:.1f}s")
    rtol, atol = RTOL, ATOL
    if model["name"] in MODEL_TOLERANCES:
        rtol, atol, _ = MODEL_TOLERANCES[model["name"]]
    assert set(got) == set(want), f"outputs {sorted(got)} != ORT's {sorted(want)}"
    for name in want:
        assert_close(got[name], want[name], rtol, atol, what=f"{model['name']} opset {opset} output '{name}'")


@pytest.mark.parametrize("model,opset", [c for c in CASES if c.values[1] == 13])
def test_zoo_volta_cuda_kernels_compile_for_sm70_without_spills(cli, export_cache, model, opset):
    # Every zoo model's CUDA kernels through NVRTC for Volta (no GPU needed; ~3 s for ResNet-50's
    # 53 entry points): no spills, at most 128 registers, at most 48 KiB of shared memory. The
    # full-size models also with fp16 tensor-core tiles (the tiny ones' grids are too small to
    # take them at the default threshold).
    _need(model)
    path = _export(cli, export_cache, model, opset)
    rep = cli.ok("optimize", path, "--target", "volta-cuda", "--cuda-arch", "sm_70", "--no-profile")
    assert_cuda_kernels_fit(rep["device"])
    if not model["tiny"]:
        rep = cli.ok("optimize", path, "--target", "volta-cuda", "--cuda-arch", "sm_70", "--no-profile", "--precision", "fp16")
        assert rep["device"]["precision"] == "fp16" and rep["device"]["tensor_core_kernels"] > 0, rep["device"]
        assert_cuda_kernels_fit(rep["device"])


@pytest.mark.parametrize("model,opset", CASES)
def test_zoo_convert_round_trip_in_ort(cli, export_cache, workdir, model, opset):
    _need(model)
    path = _export(cli, export_cache, model, opset)
    converted = workdir / "converted.onnx"
    cli.ok("convert", path, "-o", converted)
    onnx.checker.check_model(str(converted), full_check=True)
    m = onnx.load(str(path), load_external_data=False)
    feeds = make_inputs(m, model["description"], seed=1)
    want = run_ort(path, feeds)
    got = run_ort(converted, feeds)
    assert set(got) == set(want), f"converted outputs {sorted(got)} != original's {sorted(want)}"
    for name in want:
        assert_close(got[name], want[name], RTOL, ATOL, what=f"{model['name']} opset {opset} round trip '{name}'")


DYNAMIC_SIZES = {"batch": 2, "sequence": 12}
TINY_CASES = [c for c in CASES if c.values[0] is None or (c.values[0]["tiny"] and c.values[1] == max(
    [13] + ([17, 20] if c.values[0]["network_class"] in TRANSFORMER_CLASSES else [])))]


@pytest.mark.parametrize("model,opset", TINY_CASES)
def test_zoo_dynamic_axes_reference_matches_ort(cli, workdir, model, opset):
    """`zoo export --dynamic` (batch and sequence symbolic, as exporters with dynamic axes write
    them), fed at batch 2 and sequence 12: dims inferred from the inputs and bound by --shape."""
    _need(model)
    path = workdir / f"{model['name']}_dynamic.onnx"
    cli.ok("zoo", "export", model["name"], "-o", path, "--opset", opset, "--dynamic")
    onnx.checker.check_model(str(path), full_check=True)
    m = onnx.load(str(path))
    symbolic = {d.dim_param for vi in m.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    assert symbolic, f"--dynamic export of {model['name']} has no symbolic input dims"
    assert symbolic <= set(DYNAMIC_SIZES), f"unexpected symbolic dims {symbolic}"
    # Shape inference carries the symbols through to the outputs (no dim decays to unknown), except
    # a data-dependent count such as NonMaxSuppression's selected boxes.
    for out in cli.ok("inspect", path)["outputs"]:
        if out["name"] != "selected_indices":
            assert None not in out["shape"], f"{model['name']}: output {out['name']} lost a symbolic dim: {out['type']}"
    feeds = make_inputs(m, model["description"], seed=2, symbols=DYNAMIC_SIZES)
    want = run_ort(path, feeds)
    rtol, atol = RTOL, ATOL
    if model["name"] in MODEL_TOLERANCES:
        rtol, atol, _ = MODEL_TOLERANCES[model["name"]]
    got = cli.run_model(path, feeds, workdir / "inferred")
    for name in want:
        assert_close(got[name], want[name], rtol, atol, what=f"{model['name']} dynamic, dims from inputs, '{name}'")
    shape_args = []
    for name, arr in feeds.items():
        shape_args += ["--shape", f"{name}={','.join(map(str, arr.shape))}"]
    got = cli.run_model(path, feeds, workdir / "bound", *shape_args)
    for name in want:
        assert_close(got[name], want[name], rtol, atol, what=f"{model['name']} dynamic, --shape, '{name}'")
