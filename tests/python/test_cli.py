"""Tests of the nnfuse command-line tool (bindings/cli).

The binary comes from $NNFUSE_CLI (CTest sets it), else build/bindings/nnfuse. Models are built here
with onnx.helper; ONNX Runtime is the oracle for `run` and `convert`.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("NNFUSE_CLI", REPO / "build" / "bindings" / "nnfuse"))

COMMANDS = [["inspect"], ["convert"], ["optimize"], ["run"], ["zoo", "list"], ["zoo", "export"], ["demo"], ["rules", "check"], ["ops"]]


@pytest.fixture(scope="session", autouse=True)
def cli_binary():
    if not (CLI.is_file() and os.access(CLI, os.X_OK)):
        pytest.fail(f"nnfuse binary not found at {CLI}: build the 'nnfuse' target or set NNFUSE_CLI")


def nnfuse(*args, check=None, timeout=300):
    """Runs the CLI; returns the CompletedProcess. check=0 asserts success and shows stderr."""
    p = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert p.returncode == check, f"exit {p.returncode}, stderr:\n{p.stderr}\nstdout:\n{p.stdout}"
    return p


def nnfuse_json(*args):
    p = nnfuse(*args, "--json", check=0)
    return json.loads(p.stdout)  # the whole of stdout must be one JSON object


def assert_one_line_error(p, *needles):
    assert p.returncode != 0, f"expected failure, got exit 0; stdout:\n{p.stdout}"
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert lines, "no error message on stderr"
    assert lines[0].startswith("nnfuse: error: "), p.stderr
    # Usage errors add the usage line; nothing else.
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("usage: ")), p.stderr
    for n in needles:
        assert n in lines[0], f"{n!r} not named in: {lines[0]}"
    assert "Traceback" not in p.stderr and "terminate called" not in p.stderr


# ---------------------------------------------------------------- models built with onnx.helper

def save(model, path):
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def conv_model(path, batch="N"):
    """Conv+Relu+Add+Reshape+MatMul+Softmax with a symbolic (or fixed) batch dim."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b")
    bias = numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "bias")
    fc = numpy_helper.from_array(rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32) * 0.1, "fc")
    shape = numpy_helper.from_array(np.array([-1, 4 * 6 * 6], dtype=np.int64), "flat_shape")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "bias"], ["a"], name="add"),
        helper.make_node("Reshape", ["a", "flat_shape"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
        helper.make_node("Softmax", ["m"], ["prob/out:0"], axis=-1, name="softmax"),
    ]
    g = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6])],
        [helper.make_tensor_value_info("prob/out:0", TensorProto.FLOAT, [batch, 5])],
        [w, b, bias, fc, shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="test_cli")
    m.ir_version = 8
    return save(m, path)


def two_input_model(path):
    """Y = MatMul(A, B) + C with a Constant node, two outputs."""
    cval = numpy_helper.from_array(np.full((2, 4), 0.5, dtype=np.float32), "cval")
    nodes = [
        helper.make_node("Constant", [], ["C"], value=cval, name="const"),
        helper.make_node("MatMul", ["A", "B"], ["AB"], name="mm"),
        helper.make_node("Add", ["AB", "C"], ["Y"], name="add"),
        helper.make_node("Tanh", ["Y"], ["T"], name="tanh"),
    ]
    g = helper.make_graph(
        nodes, "two_inputs",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("T", TensorProto.FLOAT, [2, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return save(m, path)


def ort_run(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


@pytest.fixture
def convnet(tmp_path):
    return conv_model(tmp_path / "convnet.onnx")


@pytest.fixture
def twoin(tmp_path):
    return two_input_model(tmp_path / "twoin.onnx")


# ---------------------------------------------------------------- help, version, usage errors

@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_command_help(cmd):
    p = nnfuse(*cmd, "--help", check=0)
    assert p.stdout.startswith("usage: nnfuse " + " ".join(cmd)), p.stdout
    assert "options:" in p.stdout and "--json" in p.stdout
    assert "example" in p.stdout


def test_main_help_and_version():
    p = nnfuse("--help", check=0)
    for cmd in ["inspect", "convert", "optimize", "run", "zoo list", "zoo export", "demo", "rules check"]:
        assert cmd in p.stdout
    assert "tune-pipeline" in p.stdout
    v = nnfuse("--version", check=0)
    assert v.stdout.startswith("nnfuse ") and v.stdout.strip().split()[1][0].isdigit()
    assert nnfuse("zoo", "--help", check=0).stdout.startswith("usage: nnfuse zoo")


def test_run_help_mentions_single_thread():
    assert "single-threaded" in nnfuse("run", "--help", check=0).stdout


@pytest.mark.parametrize("args,needle", [
    (["frobnicate"], "frobnicate"),
    (["inspect", "m.onnx", "--bogus"], "--bogus"),
    (["run", "m.onnx", "--runs"], "--runs"),
    (["run", "m.onnx", "--shape", "--json"], "--shape"),
    (["run", "m.onnx", "--runs", "x"], "--runs"),
    (["inspect"], "MODEL"),
    (["zoo"], "subcommand"),
    (["zoo", "nope"], "nope"),
    (["tune-pipeline", "m.onnx", "--budget", "x"], "--budget"),
    (["run", "m.onnx", "--target"], "--target"),
    (["optimize"], "MODEL"),
    (["optimize", "m.onnx", "--rules"], "--rules"),
    (["run", "m.onnx", "--shape", "x=1,a"], "--shape"),
    (["zoo", "export", "x", "-o", "y.onnx", "--opset", "11"], "--opset"),
    (["convert", "m.onnx"], "--output"),
])
def test_usage_errors_exit_2(args, needle):
    p = nnfuse(*args)
    assert p.returncode == 2, p.stderr
    assert_one_line_error(p, needle)
    assert p.stderr.splitlines()[-1].startswith("usage: nnfuse")
    assert p.stdout == ""


def test_hostile_sizes_and_new_ir_versions(tmp_path):
    """Issue 20: a Range to 2^62 crashed both targets (its byte count wrapped around); a model that
    onnx 1.23's make_model stamps IR 14 was refused although it needs nothing newer."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    relu = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])
    relu.ir_version = 14
    path = tmp_path / "ir14.onnx"
    onnx.save(relu, str(path))
    for target in ("reference", "host"):
        nnfuse("run", path, "--target", target, check=0)
    ints = [helper.make_tensor(n, TensorProto.INT64, [], [v]) for n, v in (("a", 0), ("b", 2 ** 62), ("c", 1))]
    out = helper.make_tensor_value_info("r", TensorProto.INT64, None)
    rng = helper.make_model(helper.make_graph([helper.make_node("Range", ["a", "b", "c"], ["r"], name="huge")], "g", [], [out],
                                              initializer=ints), opset_imports=[helper.make_opsetid("", 13)])
    rng.ir_version = 8
    path = tmp_path / "range.onnx"
    onnx.save(rng, str(path))
    p = nnfuse("run", path, "--target", "reference")
    assert p.returncode == 1, p.stderr
    assert_one_line_error(p, "'huge'", "Range", "[4611686018427387904]", "more than 2^64 bytes")
    p = nnfuse("run", path, "--target", "host")
    assert p.returncode == 1, p.stderr
    assert_one_line_error(p, "value 'r'", "[4611686018427387904]", "more than 2^64 bytes")
    # An Expand past 2^63 elements feeding a ReduceSum: the count wrapped around to 0, and the
    # host target answered 0 with exit 0.
    shape = helper.make_tensor("s", TensorProto.INT64, [3], [2 ** 31, 2 ** 31, 4])
    axes = helper.make_tensor("ax", TensorProto.INT64, [3], [0, 1, 2])
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    y1 = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    exp = helper.make_model(helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["e"], name="big_expand"),
         helper.make_node("ReduceSum", ["e", "ax"], ["r"], keepdims=0), helper.make_node("Reshape", ["r", "one"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [y1], initializer=[shape, axes, one]),
        opset_imports=[helper.make_opsetid("", 13)])
    exp.ir_version = 8
    path = tmp_path / "expand.onnx"
    onnx.save(exp, str(path))
    for target in ("reference", "host"):
        p = nnfuse("run", path, "--target", target)
        assert p.returncode == 1, p.stderr
        assert_one_line_error(p, "expand.onnx", "'big_expand'", "Expand", "output 'e'", "[2147483648,2147483648,4]", "more than 2^63 elements")
    # Under 2^63 elements but 2^63 bytes: the host target's memory plan overflowed (SIGSEGV).
    exp.graph.initializer[0].CopyFrom(helper.make_tensor("s", TensorProto.INT64, [2], [2 ** 31, 2 ** 30]))
    exp.graph.initializer[1].CopyFrom(helper.make_tensor("ax", TensorProto.INT64, [2], [0, 1]))
    path = tmp_path / "expand2.onnx"
    onnx.save(exp, str(path))
    p = nnfuse("run", path, "--target", "host")
    assert p.returncode == 1, p.stderr
    assert_one_line_error(p, "value 'e'", "[2147483648,1073741824]", "9223372036854775808 bytes", "over the limit")
    # Tile, ConstantOfShape and Resize past any size (a scale of 1e30 converted to garbage).
    x4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    yn = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    cases = {
        "huge_tile": ([x4], helper.make_node("Tile", ["x", "k"], ["y"], name="huge_tile"),
                      helper.make_tensor("k", TensorProto.INT64, [4], [1, 1, 2 ** 40, 2 ** 40]), "more than 2^63 elements"),
        "huge_cos": ([], helper.make_node("ConstantOfShape", ["k"], ["y"], name="huge_cos"),
                     helper.make_tensor("k", TensorProto.INT64, [2], [2 ** 40, 2 ** 40]), "more than 2^63 elements"),
        "huge_resize": ([x4], helper.make_node("Resize", ["x", "", "k"], ["y"], name="huge_resize"),
                        helper.make_tensor("k", TensorProto.FLOAT, [4], [1, 1, 1e30, 1e30]), "past 2^62"),
    }
    for name, (inputs, node, init, needle) in cases.items():
        m = helper.make_model(helper.make_graph([node], "g", inputs, [yn], initializer=[init]),
                              opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        path = tmp_path / f"{name}.onnx"
        onnx.save(m, str(path))
        for target in ("reference", "host"):
            p = nnfuse("run", path, "--target", target)
            assert p.returncode == 1, p.stderr
            assert_one_line_error(p, f"{name}.onnx", f"'{name}'", node.op_type, needle)


# ---------------------------------------------------------------- inspect

def test_inspect_text_symbolic_batch(convnet):
    p = nnfuse("inspect", convnet, check=0)
    assert "float32[N,3,6,6]" in p.stdout
    assert "float32[N,5]" in p.stdout
    assert "ai.onnx 17" in p.stdout
    for op in ["Conv", "Relu", "Add", "Reshape", "MatMul", "Softmax"]:
        assert op in p.stdout


def test_inspect_json(convnet):
    j = nnfuse_json("inspect", convnet)
    assert j["opsets"] == {"ai.onnx": 17}
    assert j["ir_version"] == 8
    assert j["producer"]["name"] == "test_cli"
    assert j["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["N", 3, 6, 6], "type": "float32[N,3,6,6]"}]
    assert j["outputs"][0]["name"] == "prob/out:0"
    assert j["outputs"][0]["shape"] == ["N", 5]
    assert j["ops"] == {"Conv": 1, "Relu": 1, "Add": 1, "Reshape": 1, "MatMul": 1, "Softmax": 1}
    assert j["nodes"] == 6 and j["operators"] == 6 and j["constants"] == 0
    # 4*3*3*3 + 4 + 4 + 144*5 float32 weights + 2 int64 shape values
    # Every op's output has the symbolic batch dim: no FLOPs can be counted until it is bound.
    assert j["flops_unknown_ops"] == 6
    assert j["initializers"] == {"count": 5, "bytes": (108 + 4 + 4 + 720) * 4 + 2 * 8}
    # DNNFusion's classes: Relu one-to-one; Add broadcasting a [4,1,1] bias one-to-many; Reshape
    # reorganize; Conv, MatMul and Softmax (a reduction along the axis) many-to-many.
    assert j["mapping_types"] == {"One-to-One": 1, "One-to-Many": 1, "Reorganize": 1, "Many-to-Many": 3}


def test_inspect_shape_binding_and_flops(convnet):
    j = nnfuse_json("inspect", convnet, "--shape", "x=2,3,6,6")
    assert j["inputs"][0]["shape"] == [2, 3, 6, 6]
    assert j["outputs"][0]["shape"] == [2, 5]
    # Conv alone: 2*4*6*6 outputs, each 27 multiply-adds.
    assert j["flops"] >= 2 * 4 * 6 * 6 * 27
    assert j["flops_unknown_ops"] == 0


def test_inspect_constant_listed_separately(twoin):
    j = nnfuse_json("inspect", twoin)
    assert j["constants"] == 1
    assert "Constant" not in j["ops"]
    assert j["ops"] == {"MatMul": 1, "Add": 1, "Tanh": 1}
    assert j["nodes"] == 4 and j["operators"] == 3
    # MatMul 2x3 @ 3x4: 2*4*3 multiply-adds.
    assert j["flops"] >= 24


def test_inspect_bad_shape_binding_names_input(convnet):
    p = nnfuse("inspect", convnet, "--shape", "y=1,3,6,6")
    assert_one_line_error(p, "'y'")
    p = nnfuse("inspect", convnet, "--shape", "x=1,3,7,6")
    assert_one_line_error(p, "x")


# ---------------------------------------------------------------- convert

def test_convert_checker_and_ort(tmp_path, convnet):
    out = tmp_path / "out.onnx"
    j = nnfuse_json("convert", convnet, "-o", out)
    assert j["output"] == str(out)
    m = onnx.load(str(out))
    onnx.checker.check_model(m)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    a = ort_run(convnet, {"x": x})
    b = ort_run(out, {"x": x})
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_convert_with_shape_binding(tmp_path, convnet):
    out = tmp_path / "bound.onnx"
    nnfuse("convert", convnet, "--output", out, "--shape", "x=3,3,6,6", check=0)
    m = onnx.load(str(out))
    onnx.checker.check_model(m)
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [3, 3, 6, 6]
    x = np.random.default_rng(1).standard_normal((3, 3, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(convnet, {"x": x})["prob/out:0"], ort_run(out, {"x": x})["prob/out:0"])


# ---------------------------------------------------------------- run

def test_run_reference_matches_ort(tmp_path, convnet):
    x = np.random.default_rng(5).standard_normal((2, 3, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outdir = tmp_path / "outs"
    j = nnfuse_json("run", convnet, "--target", "reference", "--pipeline", "none",
                    "--input", f"x={tmp_path / 'x.npy'}", "--outputs", outdir)
    assert j["target"] == "reference" and j["pipeline"] == "none"
    assert len(j["outputs"]) == 1
    o = j["outputs"][0]
    assert o["name"] == "prob/out:0" and o["shape"] == [2, 5] and o["dtype"] == "float32"
    f = Path(o["file"])
    assert f.parent == outdir and f.name == "prob_out_0.npy" and f.is_file()
    got = np.load(f)
    want = ort_run(convnet, {"x": x})["prob/out:0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_run_random_inputs_seeded(tmp_path, twoin):
    a = nnfuse_json("run", twoin, "--seed", "7", "--outputs", tmp_path / "a")
    b = nnfuse_json("run", twoin, "--seed", "7", "--outputs", tmp_path / "b")
    c = nnfuse_json("run", twoin, "--outputs", tmp_path / "c")
    assert a["seed"] == 7 and c["seed"] == 0
    assert [o["name"] for o in a["outputs"]] == ["Y", "T"]
    for oa, ob, oc in zip(a["outputs"], b["outputs"], c["outputs"]):
        np.testing.assert_array_equal(np.load(oa["file"]), np.load(ob["file"]))
        assert not np.array_equal(np.load(oa["file"]), np.load(oc["file"]))
    for i in a["inputs"]:
        assert i["source"] == "random"


def test_run_npy_round_trip_two_inputs(tmp_path, twoin):
    rng = np.random.default_rng(2)
    A = rng.standard_normal((2, 3)).astype(np.float32)
    B = rng.standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "A.npy", A)
    np.save(tmp_path / "B.npy", B)
    j = nnfuse_json("run", twoin, "--input", f"A={tmp_path / 'A.npy'}", "--input", f"B={tmp_path / 'B.npy'}",
                    "--outputs", tmp_path / "o")
    files = {o["name"]: o["file"] for o in j["outputs"]}
    assert sorted(os.listdir(tmp_path / "o")) == ["T.npy", "Y.npy"]
    want = ort_run(twoin, {"A": A, "B": B})
    for name in ["Y", "T"]:
        np.testing.assert_allclose(np.load(files[name]), want[name], rtol=1e-4, atol=1e-5)
    # An output written by run feeds a later run unchanged (the .npy writer/reader agree).
    np.save(tmp_path / "A2.npy", np.load(files["Y"])[:, :3].copy())
    nnfuse("run", twoin, "--input", f"A={tmp_path / 'A2.npy'}", "--input", f"B={tmp_path / 'B.npy'}", check=0)


def test_run_latency_and_threads(twoin):
    j = nnfuse_json("run", twoin, "--runs", "5", "--threads", "4")
    assert j["runs"] == 5 and j["threads"] == 4
    lat = j["latency_ms"]
    assert 0 <= lat["min"] <= lat["median"]
    # CPU time per run (the process, all threads): as many runs, and a run costs some CPU.
    cpu = j["cpu_ms"]
    assert 0 <= cpu["min"] <= cpu["median"]


def test_run_text_output(twoin):
    p = nnfuse("run", twoin, check=0)
    assert "Y" in p.stdout and "latency" in p.stdout
    assert not p.stdout.lstrip().startswith("{")


def test_run_dynamic_model_shape_binding(tmp_path, convnet):
    # Random inputs need every dim bound.
    p = nnfuse("run", convnet)
    assert_one_line_error(p, "x")
    j = nnfuse_json("run", convnet, "--shape", "x=3,3,6,6", "--outputs", tmp_path / "o")
    assert j["outputs"][0]["shape"] == [3, 5]
    assert j["inputs"][0]["shape"] == [3, 3, 6, 6]


def test_run_npy_binds_dynamic_dims(tmp_path, convnet):
    x = np.random.default_rng(9).standard_normal((4, 3, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    j = nnfuse_json("run", convnet, "--input", f"x={tmp_path / 'x.npy'}", "--outputs", tmp_path / "o")
    got = np.load(j["outputs"][0]["file"])
    assert got.shape == (4, 5)
    np.testing.assert_allclose(got, ort_run(convnet, {"x": x})["prob/out:0"], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- run: faults named on one line

def test_run_missing_input(tmp_path, twoin):
    np.save(tmp_path / "A.npy", np.zeros((2, 3), np.float32))
    p = nnfuse("run", twoin, "--input", f"A={tmp_path / 'A.npy'}")
    assert p.returncode == 1
    assert_one_line_error(p, "missing input 'B'")


def test_run_extra_input(tmp_path, twoin):
    np.save(tmp_path / "Z.npy", np.zeros((2, 3), np.float32))
    p = nnfuse("run", twoin, "--input", f"Z={tmp_path / 'Z.npy'}")
    assert p.returncode == 1
    assert_one_line_error(p, "'Z'")


def test_run_wrong_dtype(tmp_path, twoin):
    np.save(tmp_path / "A.npy", np.zeros((2, 3), np.int64))
    np.save(tmp_path / "B.npy", np.zeros((3, 4), np.float32))
    p = nnfuse("run", twoin, "--input", f"A={tmp_path / 'A.npy'}", "--input", f"B={tmp_path / 'B.npy'}")
    assert p.returncode == 1
    assert_one_line_error(p, "'A'", "int64", "float32")


def test_run_wrong_shape(tmp_path, twoin):
    np.save(tmp_path / "A.npy", np.zeros((2, 5), np.float32))
    np.save(tmp_path / "B.npy", np.zeros((3, 4), np.float32))
    p = nnfuse("run", twoin, "--input", f"A={tmp_path / 'A.npy'}", "--input", f"B={tmp_path / 'B.npy'}")
    assert p.returncode == 1
    assert_one_line_error(p, "'A'", "[2,5]")


def test_run_nonexistent_npy(tmp_path, twoin):
    p = nnfuse("run", twoin, "--input", f"A={tmp_path / 'nope.npy'}")
    assert p.returncode == 1
    assert_one_line_error(p, "nope.npy")


def test_run_garbage_npy(tmp_path, twoin):
    (tmp_path / "A.npy").write_bytes(b"\x93NUMPY garbage \x00\x01\x02" * 3)
    np.save(tmp_path / "B.npy", np.zeros((3, 4), np.float32))
    p = nnfuse("run", twoin, "--input", f"A={tmp_path / 'A.npy'}", "--input", f"B={tmp_path / 'B.npy'}")
    assert p.returncode == 1
    assert_one_line_error(p, "A.npy")


def test_nonexistent_model(tmp_path):
    for cmd in (["inspect"], ["run"], ["convert"]):
        args = [*cmd, tmp_path / "missing.onnx"] + (["-o", tmp_path / "o.onnx"] if cmd == ["convert"] else [])
        p = nnfuse(*args)
        assert p.returncode == 1
        assert_one_line_error(p, "missing.onnx")


def test_garbage_model(tmp_path):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(bytes(range(256)) * 8)
    p = nnfuse("inspect", bad, "--json")
    assert p.returncode == 1
    assert p.stdout == ""
    assert_one_line_error(p, "garbage.onnx")


def test_unknown_option_is_error(twoin):
    p = nnfuse("run", twoin, "--frobnicate", "3")
    assert p.returncode == 2
    assert_one_line_error(p, "--frobnicate")


def test_cuda_arch_needs_the_cuda_target(convnet):
    p = nnfuse("optimize", convnet, "--cuda-arch", "sm_70")
    assert p.returncode != 0
    assert_one_line_error(p, "--target volta-cuda")


# ---------------------------------------------------------------- zoo and demo

def test_zoo_list_json():
    j = nnfuse_json("zoo", "list")
    assert isinstance(j["models"], list)
    for m in j["models"]:
        assert set(m) == {"name", "class", "tiny", "description"}
        assert isinstance(m["tiny"], bool) and m["name"]


def test_zoo_export_tiny(tmp_path):
    models = nnfuse_json("zoo", "list")["models"]
    tiny = [m["name"] for m in models if m["tiny"]]
    if not tiny:
        assert models == [] or not tiny  # nothing tiny to export in this build
        return
    name = "bert_tiny" if "bert_tiny" in tiny else tiny[0]
    out = tmp_path / f"{name}.onnx"
    j = nnfuse_json("zoo", "export", name, "-o", out, "--opset", "17", "--seed", "1")
    assert j["name"] == name and j["opset"] == 17
    m = onnx.load(str(out))
    onnx.checker.check_model(m)
    assert {o.domain: o.version for o in m.opset_import}.get("", 0) == 17
    # The exported file is a model our own importer and interpreter accept.
    nnfuse("run", out, "--json", check=0)


def test_zoo_export_unknown_name(tmp_path):
    p = nnfuse("zoo", "export", "no_such_model", "-o", tmp_path / "x.onnx")
    assert p.returncode == 1
    assert_one_line_error(p, "no_such_model")


def test_demo_text():
    p = nnfuse("demo", check=0, timeout=600)
    assert "round-trip" in p.stdout and "FLOPs" in p.stdout


def test_demo_json():
    j = nnfuse_json("demo")
    assert [s["name"] for s in j["stages"]][:2] == ["build", "export"]
    assert j["max_abs_diff"] <= 1e-6
    assert j["operators"] > 0 and sum(j["mapping_types"].values()) == j["operators"]


def test_run_output_names_sanitised_and_distinct(tmp_path):
    # Two outputs whose names differ only in characters a filesystem cannot take.
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a/b"]), helper.make_node("Neg", ["x"], ["a:b"])], "names",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("a/b", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("a:b", TensorProto.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = save(m, tmp_path / "names.onnx")
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    j = nnfuse_json("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--outputs", tmp_path / "o")
    files = {o["name"]: Path(o["file"]) for o in j["outputs"]}
    assert sorted(f.name for f in files.values()) == sorted(os.listdir(tmp_path / "o"))
    assert len(set(files.values())) == 2 and all(f.name.startswith("a_b") for f in files.values())
    np.testing.assert_array_equal(np.load(files["a/b"]), np.maximum(x, 0))
    np.testing.assert_array_equal(np.load(files["a:b"]), -x)


def test_inspect_reports_failed_inference(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["z"], name="bad_add")], "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "bad.onnx"
    onnx.save(m, str(path))
    j = nnfuse_json("inspect", path)  # still described...
    assert j["shapes_inferred"] is False and "bad_add" in j["shape_inference_error"]
    assert j["ops"] == {"Add": 1}
    p = nnfuse("run", path)  # ...but not run
    assert p.returncode == 1
    assert_one_line_error(p, "bad_add")


def _conv3x3_chain(path):
    """x [1,5,24,24] -> Conv3x3 p1 (20) -> Relu -> Conv3x3 p1 (20): two 3x3 stride-1 layers whose
    algorithm (direct or Winograd) has a choice."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array((rng.standard_normal((20, 5, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((20, 20, 3, 3)) * 0.2).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "conv3x3_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 24, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 24, 24])], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return save(m, path)


def test_compile_times_conv_algorithms_unless_no_profile(tmp_path):
    model = _conv3x3_chain(tmp_path / "m.onnx")
    x = np.random.default_rng(4).standard_normal((1, 5, 24, 24)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort_run(model, {"x": x})["y"]
    # Default: each 3x3 layer's algorithm is timed here; the timings land in the kernel cache and
    # the artifact keeps the measured choices (and runs them).
    nnfuse("compile", model, "-o", tmp_path / "art", "--cache-dir", tmp_path / "cache", check=0)
    plan = json.loads((tmp_path / "art" / "plan.json").read_text())
    assert len(plan["conv_algorithm_measured"]) == 2
    assert all(t["source"] == "measured" and t["direct_nchwc"] > 0 for t in plan["conv_timings"].values())
    timings = json.loads((tmp_path / "cache" / "conv_timings.json").read_text())
    assert sum(len(shapes) for shapes in timings.values()) == 2
    nnfuse("run", tmp_path / "art", "--input", f"x={tmp_path / 'x.npy'}", "--outputs", tmp_path / "o1", check=0)
    np.testing.assert_allclose(np.load(tmp_path / "o1" / "y.npy"), want, rtol=1e-4, atol=1e-4)
    # --no-profile: the cost model alone; nothing timed, nothing written.
    nnfuse("compile", model, "-o", tmp_path / "art2", "--cache-dir", tmp_path / "cache2", "--no-profile", check=0)
    plan2 = json.loads((tmp_path / "art2" / "plan.json").read_text())
    assert "conv_algorithm_measured" not in plan2 and "conv_timings" not in plan2
    assert not (tmp_path / "cache2" / "conv_timings.json").exists()
    nnfuse("run", tmp_path / "art2", "--input", f"x={tmp_path / 'x.npy'}", "--outputs", tmp_path / "o2", check=0)
    np.testing.assert_allclose(np.load(tmp_path / "o2" / "y.npy"), want, rtol=1e-4, atol=1e-4)


def test_compile_json_reports_phases_and_shared_implementations(tmp_path):
    # Two identical layers (MatMul + Relu on their own weights): their stages have the same code
    # but for the buffers, so they compile as one implementation. The report gives the phases and
    # the counts; a second compile into the same cache is a hit.
    rng = np.random.default_rng(5)
    ws = [numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.2).astype(np.float32), f"w{i}") for i in range(2)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"]), helper.make_node("Relu", ["m0"], ["r0"]),
             helper.make_node("MatMul", ["r0", "w1"], ["m1"]), helper.make_node("Relu", ["m1"], ["y"])]
    g = helper.make_graph(nodes, "two_layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], ws)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = save(m, tmp_path / "m.onnx")
    first = nnfuse_json("compile", model, "-o", tmp_path / "art", "--cache-dir", tmp_path / "cache")
    phases = first["phases_ms"]
    assert set(phases) == {"load", "optimize", "compile", "save"} and all(v >= 0 for v in phases.values())
    assert first["total_ms"] == pytest.approx(phases["optimize"] + phases["compile"] + phases["save"])
    build = first["compile"]["build"]
    assert build["cache_hit"] is False
    assert build["stages"] == 2 and build["implementations"] == 1
    again = nnfuse_json("compile", model, "-o", tmp_path / "art2", "--cache-dir", tmp_path / "cache")
    assert again["compile"]["build"]["cache_hit"] is True
    x = rng.standard_normal((8, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    nnfuse("run", tmp_path / "art", "--input", f"x={tmp_path / 'x.npy'}", "--outputs", tmp_path / "o", check=0)
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), ort_run(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_optimize_for_a_gpu_target_lists_host_stages(cli, tmp_path):
    """`optimize --target volta-cuda|mali-opencl` prints the device kernels without compiling, and
    names the stages that would run on the host (the LSTM cells) with the reason."""
    lstm, cnn = tmp_path / "lstm.onnx", tmp_path / "cnn.onnx"
    cli.ok("zoo", "export", "lstm_tiny", "-o", lstm)
    cli.ok("zoo", "export", "resnet_tiny", "-o", cnn)
    rep = cli.ok("optimize", lstm, "--target", "volta-cuda", "--no-profile")
    dev = rep["device"]
    assert dev["kernels"] > 0 and dev["entry_points"] <= dev["kernels"]
    assert dev["host_stages"] and all("LSTM" in h["ops"] and "LSTM" in h["reason"] for h in dev["host_stages"])
    rep = cli.ok("optimize", cnn, "--target", "mali-opencl", "--no-profile")
    assert rep["device"]["host_stages"] == []
    assert "device" not in cli.ok("optimize", cnn, "--target", "host", "--no-profile")
