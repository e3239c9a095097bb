"""The Python package (`import nnfuse`) against ONNX Runtime, run on the *installed* package.

scripts/test_package.sh installs the package with `pip install .` into a fresh virtual environment
and runs this file from outside the source tree with NNFUSE_REQUIRE_INSTALLED=1, so `nnfuse` comes
from site-packages. In a plain `pytest tests/python` run without the package installed the file is
skipped (the CLI suites cover the build tree there).

Checks: the InferenceSession drop-in gives ONNX Runtime's outputs on the tiny zoo models; bad inputs
(wrong dtype, wrong shape, missing feed, unknown input or output name, malformed model bytes) raise
nnfuse's own exceptions with clear messages; the optimize report has the contract's fields; the export
helpers and `python -m nnfuse` work.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REQUIRE_INSTALLED = os.environ.get("NNFUSE_REQUIRE_INSTALLED") == "1"
if REQUIRE_INSTALLED:
    import nnfuse
else:
    nnfuse = pytest.importorskip("nnfuse", reason="the nnfuse Python package is not installed (scripts/test_package.sh installs it)")

ort = pytest.importorskip("onnxruntime")

TINY_MODELS = ["resnet_tiny", "mobilenet_tiny", "efficientnet_tiny", "ssd_tiny", "bert_tiny", "gpt2_tiny", "vit_tiny", "lstm_tiny"]
RTOL, ATOL = 1e-4, 1e-5
# "reference" runs everywhere. "host" joins when this build has the CPU code generator; compiling
# generated kernels cold takes 10-50 s a model on 2 cores, so by default host runs on one model per
# network family and on all of them with NNFUSE_TEST_HOST_FULL=1 (the kernel cache makes re-runs cheap).
HOST_MODELS = set(TINY_MODELS) if os.environ.get("NNFUSE_TEST_HOST_FULL") == "1" else {"resnet_tiny", "bert_tiny", "gpt2_tiny", "lstm_tiny"}


def _host_available() -> bool:
    """Whether target="host" compiles: probed on a one-operator model, which is quick to compile."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    try:
        nnfuse.compile(nnfuse.load(model.SerializeToString()), target="host")
        return True
    except nnfuse.Error:  # no code generator in this build, or it fails here: test reference only
        return False


def _opencl_available() -> bool:
    """An OpenCL platform with a device (PoCL in CI) for the mali-opencl target. (test_node_opencl.py
    has the same probe: this file is copied alone into a fresh venv by scripts/test_package.sh, so
    it cannot import a shared helper.)"""
    import ctypes

    try:
        cl = ctypes.CDLL("libOpenCL.so.1")
    except OSError:
        return False
    n = ctypes.c_uint(0)
    return cl.clGetPlatformIDs(0, None, ctypes.byref(n)) == 0 and n.value > 0


CASES = [(name, "reference") for name in TINY_MODELS]
# The GPU path through OpenCL (PoCL runs it on the CPU here): a CNN and a transformer.
if _opencl_available() or os.environ.get("CI"):
    CASES += [(name, "mali-opencl") for name in ("resnet_tiny", "bert_tiny")]
HOST = _host_available()
needs_host = pytest.mark.skipif(not HOST, reason="this build has no CPU code generator")
if HOST:
    CASES += [(name, "host") for name in TINY_MODELS if name in HOST_MODELS]


def feeds_for(inputs, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded feeds for NodeArgs: floats N(0,1); integer ids in [0, 100) (every tiny vocab is at least
    100); masks all ones; symbolic dims bound to 1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in inputs:
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        dt = np.dtype(arg.dtype)
        if dt.kind == "f":
            feeds[arg.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b" or "mask" in arg.name.lower():
            feeds[arg.name] = np.ones(shape, dt)
        else:
            feeds[arg.name] = rng.integers(0, 100, size=shape).astype(dt)
    return feeds


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("zoo")
    for name in TINY_MODELS:
        nnfuse.zoo_export(name, d / f"{name}.onnx")
    return d


def test_imported_from_site_packages():
    where = Path(nnfuse.__file__).resolve()
    if REQUIRE_INSTALLED:
        assert "site-packages" in where.parts, f"nnfuse imported from {where}, not from the installed package"
    # The wheel carries the shipped pipelines, and the C++ side reads them from there.
    data = Path(nnfuse.data_dir())
    assert (data / "rules" / "pipelines" / "full.pipeline").is_file(), f"no shipped pipelines under {data}"
    if REQUIRE_INSTALLED:
        assert data.resolve() == (where.parent / "data").resolve()


def test_public_names_have_docstrings():
    for name in nnfuse.__all__:
        obj = getattr(nnfuse, name)
        if name == "__version__":
            assert isinstance(obj, str) and obj
            continue
        assert obj.__doc__ and obj.__doc__.strip(), f"nnfuse.{name} has no docstring"
    stub = Path(nnfuse.__file__).with_name("__init__.pyi")
    assert stub.is_file(), "type stubs are not installed"
    text = stub.read_text()
    for name in nnfuse.__all__:
        assert name in text, f"nnfuse.{name} is missing from __init__.pyi"


@pytest.mark.parametrize("name,target", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_inference_session_matches_onnxruntime(zoo_dir, name, target):
    path = str(zoo_dir / f"{name}.onnx")
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = nnfuse.InferenceSession(path, providers=["CPUExecutionProvider"], target=target)
    # Same interface: names, order, types and shapes of inputs and outputs.
    assert [i.name for i in sess.get_inputs()] == [i.name for i in ref.get_inputs()]
    assert [o.name for o in sess.get_outputs()] == [o.name for o in ref.get_outputs()]
    for ours, theirs in zip(sess.get_inputs() + sess.get_outputs(), ref.get_inputs() + ref.get_outputs()):
        assert ours.type == theirs.type, ours.name
        assert ours.shape == theirs.shape, ours.name
    feeds = feeds_for(sess.get_inputs())
    want = ref.run(None, feeds)
    got = sess.run(None, feeds)
    assert len(got) == len(want)
    for out, g, w in zip(ref.get_outputs(), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, out.name
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{name}/{out.name}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name}/{out.name}")
    # A subset of outputs in a chosen order.
    last = ref.get_outputs()[-1].name
    (only,) = sess.run([last], feeds)
    np.testing.assert_array_equal(only, got[-1])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_concurrent_runs_on_one_session(zoo_dir, target):
    """Several Python threads call run() on one session at once (the GIL is released while it
    runs): every result equals the unshared result for its own inputs (to rounding: concurrent
    runs share the thread pool, so a loop may be split among fewer threads)."""
    import threading
    sess = nnfuse.InferenceSession(str(zoo_dir / "resnet_tiny.onnx"), target=target)
    rng = np.random.default_rng(11)
    feeds = [{i.name: rng.standard_normal([d for d in i.shape], dtype=np.float32) for i in sess.get_inputs()} for _ in range(4)]
    want = [sess.run(None, f) for f in feeds]
    got = [[None] * 8 for _ in range(4)]
    errors = []

    def worker(k):
        try:
            for r in range(8):
                got[k][r] = sess.run(None, feeds[k])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(4):
        for r in range(8):
            for g, w in zip(got[k][r], want[k]):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _assert_matches_ort(got: dict, ort_sess, feeds, what: str) -> None:
    want = ort_sess.run(None, feeds)
    for out, w in zip(ort_sess.get_outputs(), want):
        np.testing.assert_allclose(got[out.name], w, rtol=RTOL, atol=ATOL, err_msg=f"{what}/{out.name}")


@needs_host
def test_background_compile_serves_reference_then_generated_kernels(zoo_dir, tmp_path):
    """compile(background=True) returns before the kernels are built; runs meanwhile are served by
    the reference kernels, and after wait() by the generated ones, both matching ONNX Runtime."""
    path = zoo_dir / "resnet_tiny.onnx"
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph = nnfuse.load(path)
    graph.optimize()
    # An empty kernel cache: the build runs the C++ compiler for seconds.
    model = nnfuse.compile(graph, "host", cache_dir=tmp_path / "cache", background=True)
    state = model.info["background"]
    assert state["building"] == 1 and state["ready"] == 0 and state["failed"] == 0, state
    feeds = feeds_for(model.inputs)
    _assert_matches_ort(model.run(feeds), ref, feeds, "while building")
    assert model.info["background"]["reference_runs"] == 1
    # A finished build counts as ready before any run or wait() collects it.
    import time
    deadline = time.monotonic() + 600
    while model.info["background"]["building"] and time.monotonic() < deadline:
        time.sleep(0.2)
    info = model.info
    assert info["background"]["ready"] == 1 and info.get("generated_stages", 0) > 0, info
    model.wait()
    info = model.info
    assert info["background"] == {"ready": 1, "building": 0, "failed": 0, "reference_runs": 1}, info["background"]
    assert info.get("generated_stages", 0) > 0, info  # the build's own report once it is done
    _assert_matches_ort(model.run(feeds), ref, feeds, "generated")
    assert model.info["background"]["reference_runs"] == 1  # served by the generated kernels


@needs_host
def test_background_compile_builds_each_new_input_shape_once():
    """A dynamic batch dim: each new batch size is served by the reference kernels on its first
    run while its kernels build, then by them; sizes seen before never build again."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], rng.standard_normal(8 * 27).astype(np.float32).tolist())
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 10, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "dyn", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=8)
    data = model.SerializeToString()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = nnfuse.InferenceSession(data, target="host", background=True)
    served_by_reference = 0
    for n, new_shape in [(1, True), (1, False), (3, True), (1, False), (3, False)]:
        feeds = {"x": rng.standard_normal((n, 3, 10, 9)).astype(np.float32)}
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=RTOL, atol=ATOL, err_msg=f"batch {n}")
        served_by_reference += new_shape
        assert sess.info["background"]["reference_runs"] == served_by_reference, (n, sess.info)
        sess.wait()
    assert sess.info["background"] == {"ready": 2, "building": 0, "failed": 0, "reference_runs": 2}
    # Without background: each new size is built at its first run, which waits for it.
    plain = nnfuse.InferenceSession(data, target="host")
    for n in (3, 1, 3):
        feeds = {"x": rng.standard_normal((n, 3, 10, 9)).astype(np.float32)}
        np.testing.assert_allclose(plain.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=RTOL, atol=ATOL, err_msg=f"batch {n}")
    assert plain.info == {"target": "host", "compiled_per_input_shapes": True}


@needs_host
def test_background_compile_failure_is_raised(zoo_dir, tmp_path, monkeypatch):
    """A build that fails (no C++ compiler) is raised by wait() and by every later run, naming
    the compiler; it is never silently replaced by the reference kernels."""
    monkeypatch.setenv("NNFUSE_CXX", "/nonexistent/c++")
    graph = nnfuse.load(zoo_dir / "resnet_tiny.onnx")
    graph.optimize()
    model = nnfuse.compile(graph, "host", cache_dir=tmp_path / "cache", background=True)
    with pytest.raises(nnfuse.Error, match="nonexistent"):
        model.wait()
    assert model.info["background"]["failed"] == 1
    with pytest.raises(nnfuse.Error, match="nonexistent"):
        model.run(feeds_for(model.inputs))


def test_load_optimize_compile_run(zoo_dir):
    graph = nnfuse.load(zoo_dir / "resnet_tiny.onnx")
    before = graph.num_operators
    report = graph.optimize(target="reference")
    for field in ["model", "ops_before", "ops_after_rewrite", "kernels", "network_class", "pipeline", "passes",
                  "blocks", "rules_fired", "flops_before", "flops_after"]:
        assert field in report, f"optimize report lacks '{field}'"
    assert report["ops_before"] == before
    assert report["network_class"] == "residual_cnn"
    assert isinstance(report["pipeline"], list) and report["pipeline"]
    assert all({"name", "ms", "changed"} <= set(p) for p in report["passes"])
    assert isinstance(report["rules_fired"], dict)
    # A residual CNN fuses: fewer kernels than operators after rewriting.
    assert 0 < report["kernels"] < report["ops_after_rewrite"]
    assert graph.optimized and graph.report["kernels"] == report["kernels"]

    compiled = nnfuse.compile(graph, target="reference")
    assert compiled.target == "reference"
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    name = graph.inputs[0].name
    out = compiled.run({name: x})
    ref = ort.InferenceSession(str(zoo_dir / "resnet_tiny.onnx"), providers=["CPUExecutionProvider"])
    (want,) = ref.run(None, {name: x})
    (got,) = out.values()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_load_from_bytes_and_modelproto(zoo_dir):
    import onnx

    path = zoo_dir / "vit_tiny.onnx"
    a = nnfuse.load(path.read_bytes())
    b = nnfuse.load(onnx.load(str(path)))
    assert [i.name for i in a.inputs] == [i.name for i in b.inputs]
    assert a.num_operators == b.num_operators > 0


def test_outputs_are_numpy_arrays_owning_their_buffer(zoo_dir):
    sess = nnfuse.InferenceSession(zoo_dir / "resnet_tiny.onnx", target="reference", pipeline="none")
    feeds = feeds_for(sess.get_inputs())
    (a,) = sess.run(None, feeds)
    (b,) = sess.run(None, feeds)
    assert isinstance(a, np.ndarray) and a.flags.c_contiguous
    np.testing.assert_array_equal(a, b)
    assert not np.shares_memory(a, b), "two runs returned the same buffer"
    del sess
    assert np.isfinite(a).all()  # the array outlives the session


def test_aligned_and_unaligned_inputs_give_same_result(zoo_dir):
    sess = nnfuse.InferenceSession(zoo_dir / "resnet_tiny.onnx", target="reference", pipeline="none")
    x = feeds_for(sess.get_inputs())
    name = sess.get_inputs()[0].name
    (want,) = sess.run(None, x)
    # A Fortran-ordered copy and an unaligned view are copied in; results must not change.
    fortran = np.asfortranarray(x[name])
    raw = np.zeros(x[name].size * 4 + 4, np.uint8)
    unaligned = raw[4:].view(np.float32).reshape(x[name].shape)
    unaligned[...] = x[name]
    for variant in (fortran, unaligned):
        (got,) = sess.run(None, {name: variant})
        np.testing.assert_array_equal(got, want)


# ---- Errors -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def session(zoo_dir):
    return nnfuse.InferenceSession(zoo_dir / "resnet_tiny.onnx", target="reference", pipeline="none")


def test_wrong_dtype(session):
    inp = session.get_inputs()[0]
    x = np.zeros([d for d in inp.shape], np.float64)
    with pytest.raises(nnfuse.InvalidArgument) as e:
        session.run(None, {inp.name: x})
    msg = str(e.value)
    assert inp.name in msg and "float64" in msg and "float32" in msg, msg
    assert isinstance(e.value, nnfuse.Error) and isinstance(e.value, ValueError)
    assert e.value.kind == "invalid"


def test_wrong_shape(session):
    inp = session.get_inputs()[0]
    with pytest.raises(nnfuse.InvalidArgument) as e:
        session.run(None, {inp.name: np.zeros((1, 3, 16, 16), np.float32)})
    msg = str(e.value)
    assert inp.name in msg and "[1,3,16,16]" in msg and "[1,3,32,32]" in msg, msg


def test_missing_feed(session):
    with pytest.raises(nnfuse.InvalidArgument) as e:
        session.run(None, {})
    assert "missing input" in str(e.value) and session.get_inputs()[0].name in str(e.value)


def test_unknown_input_name(session):
    inp = session.get_inputs()[0]
    x = np.zeros(inp.shape, np.float32)
    with pytest.raises(nnfuse.InvalidArgument) as e:
        session.run(None, {inp.name: x, "no_such_input": x})
    assert "'no_such_input' is not an input" in str(e.value)


def test_unknown_output_name(session):
    inp = session.get_inputs()[0]
    with pytest.raises(nnfuse.InvalidArgument) as e:
        session.run(["no_such_output"], {inp.name: np.zeros(inp.shape, np.float32)})
    msg = str(e.value)
    assert "'no_such_output' is not an output" in msg and session.get_outputs()[0].name in msg, msg


def test_not_an_array(session):
    inp = session.get_inputs()[0]
    with pytest.raises(nnfuse.InvalidArgument):
        session.run(None, {inp.name: np.array(["a", "b"], dtype=object)})


def test_malformed_model_bytes():
    with pytest.raises(nnfuse.Error) as e:
        nnfuse.load(b"this is not an ONNX model")
    assert isinstance(e.value, (nnfuse.ModelError, nnfuse.ParseError)), type(e.value)
    assert "<bytes>" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(nnfuse.IoError) as e:
        nnfuse.load(tmp_path / "absent.onnx")
    assert "absent.onnx" in str(e.value)
    assert isinstance(e.value, OSError)


def test_unknown_target_and_pipeline(zoo_dir):
    g = nnfuse.load(zoo_dir / "resnet_tiny.onnx")
    with pytest.raises(nnfuse.Error) as e:
        nnfuse.compile(g, target="no-such-target")
    assert "no-such-target" in str(e.value)
    with pytest.raises(nnfuse.InvalidArgument) as e:
        g.optimize(pipeline="no_such_pipeline", target="reference")
    assert "no_such_pipeline" in str(e.value) and "full" in str(e.value)
    assert not g.optimized, "a failed optimize must leave the graph as it was"


def test_parse_error_carries_location(tmp_path, zoo_dir):
    bad = tmp_path / "bad.pipeline"
    bad.write_text("pipeline broken\npass infer-shapes\nbogus line here\n")
    g = nnfuse.load(zoo_dir / "resnet_tiny.onnx")
    with pytest.raises(nnfuse.ParseError) as e:
        g.optimize(pipeline_file=bad, target="reference")
    assert e.value.file is not None and e.value.file.endswith("bad.pipeline"), e.value.file
    assert (e.value.line, e.value.col) == (3, 1), (e.value.line, e.value.col)
    assert "bogus" in str(e.value) and f"{bad}:3:1" in str(e.value)


# ---- Exports and CLI -----------------------------------------------------------------------------

def test_export_helpers(tmp_path, zoo_dir):
    import onnx

    g = nnfuse.load(zoo_dir / "mobilenet_tiny.onnx")
    with pytest.raises(nnfuse.InvalidArgument):
        nnfuse.to_dot(g)  # nothing planned yet
    g.optimize(target="reference")
    nnfuse.export_rewritten(g, tmp_path / "rewritten.onnx")
    nnfuse.export_fused(g, tmp_path / "fused.onnx")
    dot = nnfuse.to_dot(g, tmp_path / "blocks.dot")
    assert dot.startswith("digraph") or "digraph" in dot[:200]
    assert (tmp_path / "blocks.dot").read_text() == dot
    onnx.checker.check_model(onnx.load(str(tmp_path / "rewritten.onnx")))
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    assert any(n.domain == "nnfuse" for n in fused.graph.node)
    # The rewritten export runs in ONNX Runtime and agrees with the original model.
    feeds = feeds_for(g.inputs)
    want = ort.InferenceSession(str(zoo_dir / "mobilenet_tiny.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(tmp_path / "rewritten.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)


def test_python_dash_m_runs_the_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "nnfuse", "zoo", "list", "--json"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    names = [m["name"] for m in json.loads(r.stdout)["models"]]
    assert names == nnfuse.zoo_list()
    r = subprocess.run([sys.executable, "-m", "nnfuse", "inspect", str(tmp_path / "absent.onnx")], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("nnfuse: error:") and r.stderr.count("\n") == 1, r.stderr
    out = tmp_path / "m.onnx"
    r = subprocess.run([sys.executable, "-m", "nnfuse", "zoo", "export", "resnet_tiny", "-o", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "nnfuse", "optimize", str(out), "--target", "reference", "--json"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["network_class"] == "residual_cnn"


def test_low_precision_inputs_and_outputs_are_ml_dtypes_arrays():
    # float8 in, int4 and bfloat16 out: numpy has none of these types; ml_dtypes (an onnx
    # dependency) has, with nnfuse's one-byte (two for bfloat16) layout.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from onnx import TensorProto as TP, helper
    from onnx.reference import ReferenceEvaluator

    nodes = [helper.make_node("Cast", ["x"], ["f"], to=TP.FLOAT), helper.make_node("Cast", ["f"], ["i4"], to=TP.INT4),
             helper.make_node("Cast", ["f"], ["bf"], to=TP.BFLOAT16)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT8E4M3FN, [6])],
                          [helper.make_tensor_value_info(n, t, [6]) for n, t in (("i4", TP.INT4), ("bf", TP.BFLOAT16))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    x = np.array([-9.5, 3.25, 8, 0.1, -0.0, 448], np.float32).astype(ml_dtypes.float8_e4m3fn)
    got = nnfuse.InferenceSession(model.SerializeToString(), target="reference").run(None, {"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype, (g_.dtype, w.dtype)
        np.testing.assert_array_equal(g_.astype(np.float32), w.astype(np.float32))


def test_precision_fp16_needs_tensor_cores(zoo_dir):
    """precision="fp16" (tensor cores) is for volta-cuda: a CPU target rejects it naming the GPU
    targets, OpenCL naming the tensor cores its device lacks; an unknown precision is refused."""
    g = nnfuse.load(zoo_dir / "resnet_tiny.onnx")
    with pytest.raises(nnfuse.InvalidArgument) as e:
        nnfuse.compile(g, "reference", precision="fp16")
    assert "GPU targets" in str(e.value) and "reference" in str(e.value), str(e.value)
    with pytest.raises(nnfuse.InvalidArgument) as e:
        nnfuse.compile(g, "reference", precision="int4")
    assert "int4" in str(e.value) and "fp32 or fp16" in str(e.value), str(e.value)
    if _opencl_available():
        with pytest.raises(nnfuse.UnsupportedError) as e:
            nnfuse.InferenceSession(zoo_dir / "resnet_tiny.onnx", target="mali-opencl", precision="fp16")
        assert "tensor cores" in str(e.value) and "opencl" in str(e.value), str(e.value)
        # In the background the reference kernels serve runs (in fp32); the build's refusal comes
        # from wait().
        model = nnfuse.compile(g, "mali-opencl", background=True, precision="fp16")
        with pytest.raises(nnfuse.UnsupportedError) as e:
            model.wait()
        assert "tensor cores" in str(e.value), str(e.value)


def _sequence_model():
    """x [6, 2] -> SplitToSequence (chunks of 4: [4, 2] and [2, 2]) -> SequenceInsert of y at the
    front -> ConcatFromSequence on axis 0, and the sequence itself as an output; a sequence
    input `s` whose length is an output too."""
    from onnx import TensorProto, helper

    seq_f = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    nodes = [
        helper.make_node("Constant", [], ["chunk"], value=helper.make_tensor("chunk", TensorProto.INT64, [], [4])),
        helper.make_node("SplitToSequence", ["x", "chunk"], ["parts"], axis=0),
        helper.make_node("SequenceInsert", ["parts", "y", "zero"], ["seq"]),
        helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=0),
        helper.make_node("SequenceLength", ["s"], ["n"]),
    ]
    graph = helper.make_graph(
        nodes, "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 2]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
         helper.make_value_info("s", seq_f)],
        [helper.make_tensor_value_info("cat", TensorProto.FLOAT, None),
         helper.make_value_info("seq", seq_f),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        initializer=[helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sequence_values_in_and_out_match_onnx_runtime():
    """Sequence inputs are lists of arrays, sequence outputs come back as lists (reference target);
    the compiled targets refuse them by name."""
    model = _sequence_model()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 2)).astype(np.float32)
    y = rng.standard_normal((1, 2)).astype(np.float32)
    s = [rng.standard_normal((3,)).astype(np.float32) for _ in range(3)]
    compiled = nnfuse.compile(nnfuse.load(model), target="reference")
    got = compiled.run({"x": x, "y": y, "s": s})
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cat, seq, n = ref.run(None, {"x": x, "y": y, "s": s})
    np.testing.assert_array_equal(got["cat"], cat)
    assert isinstance(got["seq"], list) and [a.shape for a in got["seq"]] == [(1, 2), (4, 2), (2, 2)]
    for g, w in zip(got["seq"], seq):
        np.testing.assert_array_equal(g, w)
    assert int(got["n"]) == int(n) == 3
    # An empty sequence takes the declared element type.
    assert int(compiled.run({"x": x, "y": y, "s": []})["n"]) == 0
    with pytest.raises(nnfuse.InvalidArgument, match=r"input 's\[1\]' has numpy dtype"):
        compiled.run({"x": x, "y": y, "s": [s[0], "text"]})
    with pytest.raises(nnfuse.InvalidArgument, match=r"input 's' is seq\(float32\[\?\]\): give a list of arrays"):
        compiled.run({"x": x, "y": y, "s": s[0]})
    # A list for a tensor input is an array, as numpy makes it (not a sequence).
    with pytest.raises(nnfuse.InvalidArgument, match=r"input 'x' has shape \[1,3\]"):
        compiled.run({"x": [s[0]], "y": y, "s": s})
    if _host_available():
        with pytest.raises(nnfuse.UnsupportedError, match="sequence and optional values are not supported on the compiled targets"):
            nnfuse.compile(nnfuse.load(model), target="host").run({"x": x, "y": y, "s": s})
