"""Shared fixtures for the nnfuse Python suites: every test drives the `nnfuse` CLI binary.

The binary comes from $NNFUSE_CLI (CTest sets it) or <repo>/build/bindings/nnfuse.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEFAULT_CLI = REPO_ROOT / "build" / "bindings" / "nnfuse"

if str(HERE) not in sys.path:  # lets tests import node_conformance and each other's helpers
    sys.path.insert(0, str(HERE))


def cli_path() -> Path:
    return Path(os.environ.get("NNFUSE_CLI") or DEFAULT_CLI)


class CliError(AssertionError):
    """A CLI call that was expected to succeed did not; the message carries its stderr."""


class Cli:
    """Runs the nnfuse binary. `run_cli(*args)` returns (rc, stdout parsed as JSON when it is JSON
    (else the text), stderr). `ok(*args)` adds --json, asserts success and returns the object."""

    def __init__(self, path: Path, timeout: float = 600.0):
        self.path = Path(path)
        self.timeout = timeout

    def __call__(self, *args, timeout: float | None = None):
        return self.run_cli(*args, timeout=timeout)

    def run_cli(self, *args, timeout: float | None = None):
        cmd = [str(self.path)] + [str(a) for a in args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or self.timeout)
        out = p.stdout
        try:
            out = json.loads(p.stdout)
        except (json.JSONDecodeError, ValueError):
            pass
        return p.returncode, out, p.stderr

    def ok(self, *args, timeout: float | None = None):
        args = list(args)
        if "--json" not in args:
            args.append("--json")
        rc, out, err = self.run_cli(*args, timeout=timeout)
        if rc != 0:
            raise CliError(f"`nnfuse {' '.join(map(str, args))}` exited {rc}: {err.strip()}")
        if not isinstance(out, (dict, list)):
            raise CliError(f"`nnfuse {' '.join(map(str, args))}` printed no JSON on stdout: {str(out)[:300]!r}")
        return out

    def run_model(self, model, feeds: dict[str, np.ndarray], workdir: Path, *extra,
                  target: str = "reference", pipeline: str = "none") -> dict[str, np.ndarray]:
        """`nnfuse run` with the given feeds; returns the outputs by name."""
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        args = ["run", model, "--target", target, "--pipeline", pipeline]
        for i, (name, arr) in enumerate(feeds.items()):
            if arr.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4, ...): .npy cannot hold them
                import onnx.numpy_helper

                f = workdir / f"in_{i}.pb"
                f.write_bytes(onnx.numpy_helper.from_array(arr, name).SerializeToString())
            else:
                f = workdir / f"in_{i}.npy"
                np.save(f, np.array(arr, order="C", copy=True))  # keeps 0-d arrays 0-d
            args += ["--input", f"{name}={f}"]
        outdir = workdir / "outputs"
        outdir.mkdir(exist_ok=True)
        args += ["--outputs", outdir, *extra]
        report = self.ok(*args)
        return {o["name"]: load_output(o["file"]) for o in report["outputs"]}


def load_output(path: str) -> np.ndarray:
    """An output file of `nnfuse run --outputs`: .npy, or an onnx.TensorProto .pb for the dtypes
    numpy lacks (read as ml_dtypes arrays)."""
    if str(path).endswith(".pb"):
        import onnx
        import onnx.numpy_helper

        t = onnx.TensorProto()
        t.ParseFromString(Path(path).read_bytes())
        return onnx.numpy_helper.to_array(t)
    return np.load(path)


def _require_cli() -> Path:
    p = cli_path()
    if not p.is_file() or not os.access(p, os.X_OK):
        pytest.fail(
            f"nnfuse CLI binary not found at {p}. Build it (`ninja -C build nnfuse`) or point "
            f"NNFUSE_CLI at it.", pytrace=False)
    return p


@pytest.fixture(scope="session")
def nnfuse_cli() -> Path:
    """Path of the nnfuse binary; fails the test with a clear message when it is missing."""
    return _require_cli()


@pytest.fixture(scope="session")
def cli(nnfuse_cli) -> Cli:
    return Cli(nnfuse_cli)


@pytest.fixture
def run_cli(cli):
    """run_cli(*args) -> (rc, stdout JSON or text, stderr)."""
    return cli.run_cli


@pytest.fixture
def workdir(tmp_path_factory, request) -> Path:
    """A fresh temporary directory named after the test."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    return tmp_path_factory.mktemp(name)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5, what: str = ""):
    """Float: |got-want| <= atol + rtol*|want| with NaN positions equal; ints/bools exact."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != expected {want.dtype}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def pytest_configure(config):
    config.addinivalue_line("markers", "full_size: a full-size zoo model (heavier; see NNFUSE_TEST_FULL)")


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory):
    """Zoo models exported once per session (the 100M-parameter ones take ~20 s each) and shared
    by every suite that needs them."""
    return {"dir": tmp_path_factory.mktemp("zoo"), "files": {}}


def assert_cuda_kernels_fit(device_report: dict, require_kernels: bool = True) -> None:
    """The `device` part of `nnfuse optimize --target volta-cuda --cuda-arch sm_70`: the kernels
    compiled with no spills, at most 128 registers (two 256-thread blocks per SM) and 48 KiB of
    shared memory. Skips where no NVRTC targets sm_70, except on CI, which installs one."""
    assert "error" not in device_report, device_report
    cc = device_report["cuda_compile"]
    if "error" in cc:
        if "NVRTC" in cc["error"] and not os.environ.get("CI"):
            pytest.skip(f"no NVRTC for sm_70 here (pip install nvidia-cuda-nvrtc-cu12): {cc['error'][:200]}")
        pytest.fail(cc["error"][:2000])
    assert len(cc["kernels"]) == device_report["entry_points"]
    assert device_report["entry_points"] > 0 or not require_kernels
    assert cc["max_spill_bytes"] == 0, [k for k in cc["kernels"] if k["spill_stores"] or k["spill_loads"]]
    assert cc["max_registers"] <= 128
    assert cc["max_registers"] > 0 or device_report["entry_points"] == 0
    assert cc["max_shared_bytes"] <= 48 * 1024
