"""The tiny zoo models compiled for `--target arm-neon` and run under qemu-aarch64, against ONNX Runtime.

On an x86 host, arm-neon models are standalone static aarch64 programs (generated stages plus a
generated driver, kernels/cross_run.h) built with aarch64-linux-gnu-g++ and run under
qemu-aarch64; `nnfuse run MODEL --target arm-neon` and `nnfuse run DIR` (an artifact written by
`nnfuse compile --target arm-neon -o DIR`) both do that. Outputs must match ORT within the
bounds of test_zoo_ort.py (1e-4 relative + 1e-5 absolute, or the model's MODEL_TOLERANCES).
A model with a block that still runs on reference kernels cannot be built for Arm: its test
fails with the error naming that block's op.

Each model costs one cold cross-compile (kernel cache: $NNFUSE_CACHE_DIR or ~/.cache/nnfuse;
20-45 s of CPU per tiny model). By default the two models with the LSTM and NonMaxSuppression
kernels run (resnet_tiny runs in the C++ suite, test_lowering "[arm]"); NNFUSE_TEST_FULL=1 (set
in CI) adds mobilenet_tiny (depthwise convs) and bert_tiny (attention, LayerNorm, GEMM), which
with those cover every kernel family the other four use; NNFUSE_TEST_ARM_ALL=1 runs all eight.
Skipped, with the reason, only when the cross compiler or qemu-aarch64 is absent
(scripts/setup.sh installs g++-aarch64-linux-gnu and qemu-user).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest

import test_zoo_ort as zoo
from conftest import assert_close

TINY = ["resnet_tiny", "mobilenet_tiny", "efficientnet_tiny", "ssd_tiny", "bert_tiny", "gpt2_tiny", "vit_tiny", "lstm_tiny"]
DEFAULT = {"ssd_tiny", "lstm_tiny"}
FULL_SET = DEFAULT | {"mobilenet_tiny", "bert_tiny"}
ALL = os.environ.get("NNFUSE_TEST_ARM_ALL") == "1"
EM_AARCH64 = 183

_missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if shutil.which(t) is None]
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"{' and '.join(_missing)} not installed (Debian: g++-aarch64-linux-gnu qemu-user)")


def _cases():
    cases = []
    for name in TINY:
        marks = []
        if name not in DEFAULT and not ALL:
            if name in FULL_SET:
                marks.append(pytest.mark.skipif(not zoo.FULL, reason="cold cross-compile per model: set NNFUSE_TEST_FULL=1"))
            else:
                marks.append(pytest.mark.skipif(True, reason="kernels covered by the other tiny models on Arm: set NNFUSE_TEST_ARM_ALL=1"))
        cases.append(pytest.param(name, id=name, marks=marks))
    return cases


def _description(name: str) -> str:
    for m in zoo._zoo_list():
        if m["name"] == name:
            return m["description"]
    return ""


def _run_arm(cli, model, feeds: dict, workdir, *extra) -> tuple[dict, dict]:
    """`nnfuse run MODEL --target arm-neon` with the feeds; returns (outputs, report). Fails with
    nnfuse's error (which names blocks that still need reference kernels) when it does not run."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["run", model, "--target", "arm-neon", "--threads", "2", "--json"]
    for i, (name, arr) in enumerate(feeds.items()):
        f = workdir / f"in_{i}.npy"
        np.save(f, np.array(arr, order="C", copy=True))
        args += ["--input", f"{name}={f}"]
    out = workdir / "outputs"
    args += ["--outputs", str(out), *extra]
    rc, rep, err = cli.run_cli(*args, timeout=1800)
    if rc != 0:
        pytest.fail(f"nnfuse run {model} --target arm-neon failed:\n{err}", pytrace=False)
    return {o["name"]: np.load(o["file"]) for o in rep["outputs"]}, rep


def _compare(name: str, got: dict, want: dict, what: str):
    rtol, atol = zoo.RTOL, zoo.ATOL
    if name in zoo.MODEL_TOLERANCES:
        rtol, atol, _ = zoo.MODEL_TOLERANCES[name]
    assert set(got) == set(want), f"outputs {sorted(got)} != ORT's {sorted(want)}"
    for o in want:
        assert_close(got[o], want[o], rtol, atol, what=f"{name} ({what}) output '{o}'")


@pytest.mark.parametrize("name", _cases())
def test_tiny_zoo_arm_under_qemu_matches_ort(cli, export_cache, workdir, name):
    path = zoo._export(cli, export_cache, {"name": name}, 13)
    m = onnx.load(str(path), load_external_data=False)
    feeds = zoo.make_inputs(m, _description(name))
    want = zoo.run_ort(path, feeds)
    got, rep = _run_arm(cli, path, feeds, workdir)
    build = rep["compile"]["build"]
    assert rep["compile"]["target"] == "arm-neon" and build["program"].endswith(".exe")
    assert rep["compile"]["memory"]["fallback_blocks"] == 0
    _compare(name, got, want, "arm-neon under qemu")


def _elf_machine(path) -> int:
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(head[18:20], "little")


def test_arm_artifact_runs_from_its_directory(cli, export_cache, tmp_path):
    # lstm_tiny: the LSTM kernel's weights are packed by the program at load time.
    path = zoo._export(cli, export_cache, {"name": "lstm_tiny"}, 13)
    art = tmp_path / "lstm_tiny.arm"
    j = cli.ok("compile", path, "--target", "arm-neon", "-o", art, timeout=1800)
    assert set(j["files"]) == {"model", "weights.bin", "model.onnx", "plan.json"}
    assert _elf_machine(art / "model") == EM_AARCH64
    plan = json.loads((art / "plan.json").read_text())
    assert plan["target"] == "arm-neon" and plan["kind"] == "standalone"

    m = onnx.load(str(path))
    feeds = zoo.make_inputs(m, _description("lstm_tiny"))
    want = zoo.run_ort(path, feeds)
    # No compiler needed to run it: NNFUSE_CXX names one that does not exist.
    env = dict(os.environ, NNFUSE_CXX="/nonexistent/c++")
    ins = []
    for i, (name, arr) in enumerate(feeds.items()):
        f = tmp_path / f"in_{i}.npy"
        np.save(f, arr)
        ins += ["--input", f"{name}={f}"]
    p = subprocess.run([str(cli.path), "run", str(art), *ins, "--outputs", str(tmp_path / "out"), "--json"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    _compare("lstm_tiny", {o["name"]: np.load(o["file"]) for o in rep["outputs"]}, want, "artifact")

    # The program alone: its own CLI describes the model and runs it with .npy files.
    qemu = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(art / "model")]
    info = json.loads(subprocess.run([*qemu, "--info"], capture_output=True, text=True, check=True, timeout=120).stdout)
    assert {i["name"] for i in info["inputs"]} == set(feeds)
    direct = subprocess.run([*qemu, *ins, "--outputs", str(tmp_path), "--runs", "2", "--threads", "2"], capture_output=True,
                            text=True, timeout=300)
    assert direct.returncode == 0, direct.stderr
    report = json.loads(direct.stdout)
    assert report["runs"] == 2 and report["threads"] == 2
    _compare("lstm_tiny", {o["name"]: np.load(o["file"]) for o in report["outputs"]}, want, "program run directly")
    # A wrong input is refused with the expected dtype and shape.
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 2), np.float32))
    first = next(iter(feeds))
    r = subprocess.run([*qemu, "--input", f"{first}={bad}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"input '{first}'" in r.stderr and "expects" in r.stderr

    # Without the emulator the error says what to install.
    env = dict(os.environ, NNFUSE_QEMU="/nonexistent/qemu-aarch64")
    p = subprocess.run([str(cli.path), "run", str(art), "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "qemu-user" in p.stderr and "NNFUSE_QEMU" in p.stderr
    # A damaged artifact is detected before running.
    (art / "weights.bin").write_bytes(b"\0" * 16)
    rc, _, err = cli.run_cli("run", art, "--json")
    assert rc != 0 and "weights.bin" in err and "corrupt" in err


def test_arm_compile_needs_the_cross_compiler(cli, export_cache, tmp_path):
    path = zoo._export(cli, export_cache, {"name": "resnet_tiny"}, 13)
    env = dict(os.environ, NNFUSE_CXX="/nonexistent/aarch64-linux-gnu-g++")
    p = subprocess.run([str(cli.path), "compile", str(path), "--target", "arm-neon", "-o", str(tmp_path / "a"), "--json"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "/nonexistent/aarch64-linux-gnu-g++" in p.stderr and "not found" in p.stderr
