"""The malformed-input suite (issue 20, docs/reliability.md): hostile or broken models, rule files,
pipeline files, compiled artifacts, .npy inputs and cache directories, each given to the CLI as a
user would. Every case must end with exit status 1 and one line `nnfuse: error: ...` that names
the culprit (the file, and the node, op, field, line or shape at fault), never a crash, an abort,
a hang or a silent answer.

The binary comes from $NNFUSE_CLI (CTest sets it), else build/bindings/nnfuse.
"""
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("NNFUSE_CLI", REPO / "build" / "bindings" / "nnfuse"))
MODELS = REPO / "tests" / "data" / "models"
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def nnfuse(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)


def assert_clear_error(p, *needles):
    crash = p.returncode < 0 or p.returncode >= 128
    assert not crash, f"crashed (status {p.returncode}):\n{p.stderr[-3000:]}"
    assert p.returncode == 1, f"exit {p.returncode}, expected 1; stdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr[-2000:]}"
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("nnfuse: error: "), p.stderr[-3000:]
    for n in needles:
        assert n in lines[0], f"{n!r} not named in: {lines[0]}"


def vi(name, dims, t=F):
    return helper.make_tensor_value_info(name, t, dims)


def save(tmp, name, nodes, inputs, outputs, inits=(), opset=17, ir=8, functions=()):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else []),
                          functions=list(functions))
    m.ir_version = ir
    path = tmp / f"{name}.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def i64(name, vals, dims=None):
    return helper.make_tensor(name, I64, [len(vals)] if dims is None else dims, vals)


# ---------------------------------------------------------------- models: (builder, needles)
# A builder takes tmp_path and returns (cli args, needles); `run` cases go through the reference
# interpreter, which every model path shares (import, shape inference, validation, kernels).

def ref(path, *extra):
    return ["run", path, "--target", "reference", *extra]


def _committed(name, *needles):
    return lambda tmp: (ref(MODELS / name), [name, *needles])


def _raw_data_short(tmp):
    t = helper.make_tensor("w", F, [4], [1.0, 2.0, 3.0, 4.0])
    t.raw_data = b"\0" * 8
    del t.float_data[:]
    p = save(tmp, "raw_short", [helper.make_node("Add", ["x", "w"], ["y"], name="add")], [vi("x", [4])], [vi("y", [4])], [t])
    return ref(p), ["raw_short.onnx", "'w'"]


def _external(tmp, location, offset=None, name="ext"):
    t = helper.make_tensor("w", F, [4], [0.0] * 4)
    del t.float_data[:]
    t.data_location = TensorProto.EXTERNAL
    entries = [("location", location)] + ([("offset", str(offset)), ("length", "16")] if offset is not None else [])
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    sub = tmp / name
    sub.mkdir()
    (sub / "w.bin").write_bytes(b"\0" * 16)
    p = save(sub, name, [helper.make_node("Add", ["x", "w"], ["y"], name="add")], [vi("x", [4])], [vi("y", [4])], [t])
    return ref(p), [f"{name}.onnx", "'w'"]


def _node_model(name, op, inputs, outputs, inits=(), attrs=None, opset=17, node_inputs=None, out_types=None):
    def build(tmp):
        ins = [vi(n, d) if not isinstance(d, tuple) else vi(n, list(d[0]), d[1]) for n, d in inputs.items()]
        outs = [vi(o, None) for o in outputs] if out_types is None else out_types
        node = helper.make_node(op, node_inputs or list(inputs) + [t.name for t in inits], outputs, name=f"bad_{name}", **(attrs or {}))
        p = save(tmp, name, [node], ins, outs, inits, opset=opset)
        return ref(p), [f"{name}.onnx", f"'bad_{name}'", op]
    return build


def _huge_input(tmp):
    p = save(tmp, "huge_input", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [10 ** 13])], [vi("y", [10 ** 13])])
    return ref(p), ["huge_input.onnx", "'x'", "[10000000000000]"]


def _shape_input_rank(tmp):
    # Found by fuzz_model: a shape input declared [2^40] long was taken as the output's rank.
    p = save(tmp, "shape_rank", [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_shape_rank")],
             [vi("x", [2]), vi("s", [2 ** 40], I64)], [vi("y", None)])
    return ref(p), ["shape_rank.onnx", "'bad_shape_rank'", "Reshape", "at most 64"]


def _endless_loop(tmp):
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v"], ["v_out"])],
                             "body", [vi("i", [], I64), vi("cond_in", [], TensorProto.BOOL), vi("v", [1])],
                             [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [1])])
    t = helper.make_tensor("c", TensorProto.BOOL, [], [True])
    loop = helper.make_node("Loop", ["", "c", "x"], ["y"], name="endless", body=body)
    p = save(tmp, "endless", [loop], [vi("x", [1])], [vi("y", [1])], [t])
    return ref(p), ["endless.onnx", "'endless'", "Loop", "1000 iterations", "NNFUSE_MAX_LOOP_ITERATIONS"]


def _two_producers(tmp):
    p = save(tmp, "two_producers", [helper.make_node("Relu", ["x"], ["y"], name="first"), helper.make_node("Neg", ["x"], ["y"], name="second")],
             [vi("x", [2])], [vi("y", [2])])
    return ref(p), ["two_producers.onnx", "'y'"]


def _output_not_produced(tmp):
    p = save(tmp, "orphan_out", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2])], [vi("y", [2]), vi("nowhere", [2])])
    return ref(p), ["orphan_out.onnx", "'nowhere'"]


def _attr_type(tmp):
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="bad_attr", strides=[1.5, 1.5])
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    p = save(tmp, "attr_type", [node], [vi("x", [1, 1, 4, 4])], [vi("y", None)], [w])
    return ref(p), ["attr_type.onnx", "'bad_attr'", "strides"]


def _constant_without_value(tmp):
    p = save(tmp, "empty_constant", [helper.make_node("Constant", [], ["c"], name="hollow"), helper.make_node("Add", ["x", "c"], ["y"], name="add")],
             [vi("x", [2])], [vi("y", None)])
    return ref(p), ["empty_constant.onnx", "'hollow'", "Constant"]


def _if_without_branch(tmp):
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t", [2])])
    node = helper.make_node("If", ["c"], ["y"], name="half_if", then_branch=then)
    p = save(tmp, "half_if", [node], [vi("x", [2]), vi("c", [], TensorProto.BOOL)], [vi("y", None)])
    return ref(p), ["half_if.onnx", "'half_if'", "else_branch"]


def _recursive_function(tmp):
    f = helper.make_function("local", "Rec", ["a"], ["b"], [helper.make_node("Rec", ["a"], ["b"], domain="local")],
                             [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    node = helper.make_node("Rec", ["x"], ["y"], name="calls_itself", domain="local")
    p = save(tmp, "recursive_fn", [node], [vi("x", [2])], [vi("y", None)], functions=[f])
    return ref(p), ["recursive_fn.onnx", "Rec"]


def _function_bomb(tmp):
    # 12 levels of functions, each calling the one below 10 times: 3 KB that inline to 10^12 Relus.
    # The node limit (4 million by default; NNFUSE_MAX_GRAPH_NODES) stops it within seconds.
    funcs = [helper.make_function("local", "F0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], [helper.make_opsetid("", 17)])]
    for k in range(1, 13):
        names = ["x"] + [f"t{i}" for i in range(9)] + ["y"]
        body = [helper.make_node(f"F{k - 1}", [names[i]], [names[i + 1]], domain="local") for i in range(10)]
        funcs.append(helper.make_function("local", f"F{k}", ["x"], ["y"], body, [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    node = helper.make_node("F12", ["x"], ["y"], name="bomb", domain="local")
    p = save(tmp, "function_bomb", [node], [vi("x", [2])], [vi("y", None)], functions=funcs)
    return ref(p), ["function_bomb.onnx", "NNFUSE_MAX_GRAPH_NODES", "4000000"]


def _too_many_nodes(tmp):
    # 3000 Relus against a limit of 2000 (the env of test_malformed_model): refused at import.
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(3000)]
    p = save(tmp, "many_nodes", nodes, [vi("v0", [2])], [vi("v3000", [2])])
    return ref(p), ["many_nodes.onnx", "more than 2000 nodes", "NNFUSE_MAX_GRAPH_NODES"]


def _tree_targets_past_memory(tmp):
    # n_targets = 2^40: the output would need 8 TB; refused before anything is allocated.
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], name="forest", domain="ai.onnx.ml",
                            nodes_splits=numpy_helper.from_array(np.array([0.5], np.float32)), nodes_featureids=[0],
                            nodes_modes=numpy_helper.from_array(np.array([0], np.uint8)), nodes_truenodeids=[0],
                            nodes_trueleafs=[1], nodes_falsenodeids=[1], nodes_falseleafs=[1], leaf_targetids=[0, 1],
                            leaf_weights=numpy_helper.from_array(np.array([1, 2], np.float32)), tree_roots=[0], n_targets=2 ** 40)
    g = helper.make_graph([node], "forest", [vi("x", [2, 1])], [vi("y", None)])
    p = tmp / "forest.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)], ir_version=10), str(p))
    return ref(p), ["forest.onnx", "'forest'", "TreeEnsemble", "bytes"]


def _negative_init_dim(tmp):
    t = helper.make_tensor("w", F, [2], [1.0, 2.0])
    t.dims[0] = -2
    p = save(tmp, "neg_dim", [helper.make_node("Add", ["x", "w"], ["y"], name="add")], [vi("x", [2])], [vi("y", [2])], [t])
    return ref(p), ["neg_dim.onnx", "'w'"]


def _negative_input_dim(tmp):
    p = save(tmp, "neg_input", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [-3])], [vi("y", None)])
    return ref(p), ["neg_input.onnx", "'x'"]


def _loop_body_arity(tmp):
    # The body takes (i, cond) but the Loop carries one value: the body must take three inputs.
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [vi("i", [], I64), vi("cond_in", [], TensorProto.BOOL)], [vi("cond_out", [], TensorProto.BOOL)])
    loop = helper.make_node("Loop", ["m", "", "x"], ["y"], name="bad_body", body=body)
    p = save(tmp, "loop_body", [loop], [vi("x", [1])], [vi("y", None)], [i64("m", [3], [])])
    return ref(p), ["loop_body.onnx", "'bad_body'", "Loop"]


W3 = numpy_helper.from_array(np.ones((4, 5, 3, 3), np.float32), "w")
MODEL_CASES = {
    "empty-file": _committed("empty.onnx"),
    "random-bytes": _committed("random_bytes.onnx"),
    "truncated": _committed("truncated.onnx"),
    "cycle": _committed("cycle.onnx", "cycle"),
    "dangling-edge": _committed("dangling_edge.onnx", "'haunted'", "'ghost'"),
    "unknown-op": _committed("unknown_op.onnx", "'foo_node'", "FooBar"),
    "wrong-arity": _committed("wrong_arity.onnx", "'two_inputs'", "Relu"),
    "opset-6": _committed("opset6.onnx", "opset"),
    "ir-2": _committed("ir2.onnx", "IR"),
    "raw-data-short": _raw_data_short,
    "external-data-escapes": lambda tmp: _external(tmp, "../../../etc/passwd", name="escape"),
    "external-data-missing": lambda tmp: _external(tmp, "nowhere.bin", name="missing_ext"),
    "external-data-past-end": lambda tmp: _external(tmp, "w.bin", offset=4096, name="past_end"),
    "huge-input": _huge_input,
    "shape-input-rank-2^40": _shape_input_rank,
    "endless-loop": _endless_loop,
    "two-producers": _two_producers,
    "output-not-produced": _output_not_produced,
    "attribute-type": _attr_type,
    "constant-without-value": _constant_without_value,
    "if-without-else": _if_without_branch,
    "recursive-function": _recursive_function,
    "function-bomb": _function_bomb,
    "tree-ensemble-targets-past-memory": _tree_targets_past_memory,
    "too-many-nodes": _too_many_nodes,
    "negative-initializer-dim": _negative_init_dim,
    "negative-input-dim": _negative_input_dim,
    "loop-body-arity": _loop_body_arity,
    "reshape-impossible": _node_model("reshape", "Reshape", {"x": [2, 3]}, ["y"], [i64("s", [4, 4])]),
    "gather-out-of-range": _node_model("gather", "Gather", {"x": [3]}, ["y"], [i64("idx", [10], dims=[1])]),
    "conv-channels": _node_model("conv", "Conv", {"x": [1, 3, 8, 8]}, ["y"], [W3]),
    "range-delta-zero": _node_model("range", "Range", {}, ["y"], [i64("a", [0], []), i64("b", [5], []), i64("d", [0], [])]),
    "concat-axis": _node_model("concat", "Concat", {"x": [2, 2], "z": [2, 2]}, ["y"], attrs={"axis": 5}),
    "transpose-perm": _node_model("transpose", "Transpose", {"x": [2, 3]}, ["y"], attrs={"perm": [0, 0]}),
    "softmax-axis": _node_model("softmax", "Softmax", {"x": [2, 3]}, ["y"], attrs={"axis": 4}),
    "split-sizes": _node_model("split", "Split", {"x": [6]}, ["y1", "y2"], [i64("sp", [2, 2])]),
    "slice-step-zero": _node_model("slice", "Slice", {"x": [6]}, ["y"], [i64("st", [0]), i64("en", [4]), i64("ax", [0]), i64("stp", [0])]),
    "matmul-inner": _node_model("matmul", "MatMul", {"x": [2, 3], "z": [4, 2]}, ["y"]),
    "add-dtypes": _node_model("add", "Add", {"x": [2], "z": ([2], I64)}, ["y"]),
    "expand-incompatible": _node_model("expand", "Expand", {"x": [3]}, ["y"], [i64("s", [4])]),
    "constantofshape-negative": _node_model("cos", "ConstantOfShape", {}, ["y"], [i64("s", [2, -3])]),
    "cast-to-unknown": _node_model("cast", "Cast", {"x": [2]}, ["y"], attrs={"to": 999}),
    "batchnorm-scale-length": _node_model("bn", "BatchNormalization", {"x": [1, 3, 2, 2]}, ["y"],
                                          [numpy_helper.from_array(np.ones(n, np.float32), k) for k, n in (("s", 5), ("b", 3), ("m", 3), ("v", 3))]),
}


@pytest.mark.parametrize("case", list(MODEL_CASES), ids=list(MODEL_CASES))
def test_malformed_model(tmp_path, case):
    args, needles = MODEL_CASES[case](tmp_path)
    env = {"NNFUSE_MAX_LOOP_ITERATIONS": "1000"}
    if case == "too-many-nodes":
        env["NNFUSE_MAX_GRAPH_NODES"] = "2000"
    p = nnfuse(*args, env=env, timeout=120)
    assert_clear_error(p, *needles)


def test_malformed_model_on_the_host_target(tmp_path):
    """The compiled path imports through the same code: a few of the cases again with --target host."""
    for case in ("cycle", "conv-channels", "shape-input-rank-2^40", "raw-data-short"):
        sub = tmp_path / case.replace("^", "")
        sub.mkdir()
        args, needles = MODEL_CASES[case](sub)
        args = [a if a != "reference" else "host" for a in args]
        assert_clear_error(nnfuse(*args, env={"NNFUSE_CACHE_DIR": str(tmp_path / "cache")}), *needles)


# ---------------------------------------------------------------- rule files

RULE_CASES = {
    "no-right-side": ("rule r1: Mul(x, 1) =>\n", [":1:", "expected"]),
    "unknown-op": ("rule frob: Frobnicate(x) => x\n", ["'frob'", "Frobnicate"]),
    "unknown-guard": ("rule g1: Mul(x, c) => x where shiny(c)\n", ["'g1'", "shiny"]),
    "unbound-variable": ("rule u1: Relu(x) => Neg(zz)\n", ["'u1'", "zz"]),
    "unclosed-paren": ("rule p1: Mul(x, 1 => x\n", [":1:"]),
    "no-name": ("rule : Mul(x, 1) => x\n", [":1:"]),
    "wrong-arity": ("rule a1: Relu(x, y) => x\n", ["'a1'", "Relu"]),
    "binary": ("\x00\x93\xff\xfe garbage \x01\n", [":1:"]),
    "second-line": ("rule ok: Neg(Neg(x)) => x\nrule bad: Add(x, => x\n", [":2:"]),
}


@pytest.mark.parametrize("case", list(RULE_CASES), ids=list(RULE_CASES))
def test_malformed_rule_file(tmp_path, case):
    text, needles = RULE_CASES[case]
    path = tmp_path / f"{case}.rules"
    path.write_bytes(text.encode("latin-1"))
    assert_clear_error(nnfuse("rules", "check", path), f"{case}.rules", *needles)


def test_rule_file_missing(tmp_path):
    m = save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2])], [vi("y", [2])])
    assert_clear_error(nnfuse("optimize", m, "--rules", tmp_path / "absent.rules", "--no-profile"), "absent.rules")


# ---------------------------------------------------------------- pipeline files

PIPELINE_CASES = {
    "unknown-pass": ("pipeline p\npass frobnicate\n", [":2", "frobnicate"]),
    "unknown-argument": ("pipeline p\npass dce bogus=1\n", [":2", "bogus"]),
    "bad-integer": ("pipeline p\npass cse max_rounds=lots\n", [":2"]),
    "unknown-rule": ("pipeline p\npass rules-algebraic only=no-such-rule\n", [":2", "no-such-rule"]),
    "garbage-line": ("pipeline p\nfrobnicate everything\n", [":2", "frobnicate"]),
    "binary": ("\x00\xff\xfe\x01", [":1"]),
    "argument-without-value": ("pipeline p\npass dce =\n", [":2"]),
}


@pytest.mark.parametrize("case", list(PIPELINE_CASES), ids=list(PIPELINE_CASES))
def test_malformed_pipeline_file(tmp_path, case):
    text, needles = PIPELINE_CASES[case]
    path = tmp_path / f"{case}.pipeline"
    path.write_bytes(text.encode("latin-1"))
    m = save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2])], [vi("y", [2])])
    assert_clear_error(nnfuse("optimize", m, "--pipeline-file", path, "--no-profile"), f"{case}.pipeline", *needles)


def test_pipeline_file_missing(tmp_path):
    m = save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2])], [vi("y", [2])])
    assert_clear_error(nnfuse("optimize", m, "--pipeline-file", tmp_path / "absent.pipeline"), "absent.pipeline")


# ---------------------------------------------------------------- compiled artifacts

def _convnet(tmp, name, scale, k=8):
    w = numpy_helper.from_array((np.arange(k * 3 * 9, dtype=np.float32).reshape(k, 3, 3, 3) % 7 - 3) * scale, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return save(tmp, name, nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, k, 8, 8])], [w])


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Artifacts of three models, compiled once for the module: b has a's graph and other weights,
    c other shapes (so other kernels)."""
    tmp = tmp_path_factory.mktemp("artifacts")
    env = {"NNFUSE_CACHE_DIR": str(tmp / "cache")}
    out = {}
    for name, scale, k in (("a", 0.1, 8), ("b", 0.2, 8), ("c", 0.1, 16)):
        m = _convnet(tmp, name, scale, k)
        p = nnfuse("compile", m, "-o", tmp / f"{name}.art", "--no-profile", env=env)
        assert p.returncode == 0, p.stderr
        out[name] = tmp / f"{name}.art"
    return out


def _edit_plan(edit):
    def apply(d):
        plan = json.loads((d / "plan.json").read_text())
        edit(plan)
        (d / "plan.json").write_text(json.dumps(plan))
    return apply


def _set(key, value):
    return _edit_plan(lambda p: p.__setitem__(key, value))


def _first_block(key, value):
    return _edit_plan(lambda p: p["blocks"][0].__setitem__(key, value))


def _edit_weights(path):
    m = onnx.load(str(path))
    w = m.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 2, w.name))
    onnx.save(m, str(path))


ARTIFACT_CASES = {
    "no-plan": (lambda d: (d / "plan.json").unlink(), ["no plan.json"]),
    "plan-not-json": (lambda d: (d / "plan.json").write_text("{ this is not json"), ["plan.json"]),
    "plan-truncated": (lambda d: (d / "plan.json").write_text((d / "plan.json").read_text()[:200]), ["plan.json"]),
    "target-not-string": (_set("target", ["host"]), ["plan.json", "'target'"]),
    "units-zero": (_set("units", 0), ["plan.json", "'units'"]),
    "layout-block-3": (_set("layout_block", 3), ["plan.json", "'layout_block'"]),
    "int8-dot-not-bool": (_set("int8_dot", "yes"), ["plan.json", "'int8_dot'"]),
    "unknown-format": (_set("format", "nnfuse-cpu-artifact-99"), ["unknown artifact format"]),
    "blocks-not-list": (_set("blocks", {"0": 1}), ["plan.json", "'blocks'"]),
    "member-unknown": (_first_block("members", ["no_such_node"]), ["'no_such_node'"]),
    "anchor-unknown": (_first_block("anchor", "phantom"), ["'phantom'"]),
    "mapping-type-unknown": (_first_block("mapping_type", "Sideways"), ["'Sideways'"]),
    "stages-edited": (_set("stages", ["b0_a:anchor", "b1_e0:elementwise"]), ["stale"]),
    "kernels-missing": (lambda d: (d / "kernels.so").unlink(), ["kernels.so"]),
    "kernels-truncated": (lambda d: (d / "kernels.so").write_bytes((d / "kernels.so").read_bytes()[:1000]), ["kernels.so", "checksum"]),
    "model-edited": (lambda d: _edit_weights(d / "model.onnx"), ["model.onnx", "checksum"]),
    # Compiled If/Loop/Scan bodies (kernels/cpu_bodies.cpp): a list of {node, attr, dir}, each
    # folder inside the artifact, each node a control-flow node of the model.
    "bodies-not-list": (_set("bodies", {"node": "conv"}), ["plan.json", "'bodies'"]),
    "body-folder-escapes": (_set("bodies", [{"node": "conv", "attr": "body", "dir": "../../x"}]), ["'../../x'", "outside"]),
    "body-node-not-control-flow": (_set("bodies", [{"node": "conv", "attr": "body", "dir": "b"}]), ["'conv'", "no If, Loop or Scan"]),
}


@pytest.mark.parametrize("case", list(ARTIFACT_CASES), ids=list(ARTIFACT_CASES))
def test_malformed_artifact(tmp_path, artifacts, case):
    d = tmp_path / "art"
    shutil.copytree(artifacts["a"], d)
    edit, needles = ARTIFACT_CASES[case]
    edit(d)
    assert_clear_error(nnfuse("run", d), *needles)


def test_artifact_with_another_models_kernels_and_weights(tmp_path, artifacts):
    """kernels.so or model.onnx taken from another compiled model: refused, never run. (The
    kernels of a model with the same graph and other weights are the same file: weights are data.)"""
    for part, other in (("kernels.so", "c"), ("model.onnx", "b"), ("model.onnx", "c")):
        d = tmp_path / f"{part}-{other}"
        shutil.copytree(artifacts["a"], d)
        shutil.copy(artifacts[other] / part, d / part)
        assert_clear_error(nnfuse("run", d), part, "checksum")
    assert (artifacts["a"] / "kernels.so").read_bytes() == (artifacts["b"] / "kernels.so").read_bytes()


# ---------------------------------------------------------------- .npy inputs

def _npy(arr, version=(1, 0)):
    import io
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()


def _npy_header(header: str, data=b""):
    h = header.encode("latin-1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data


NPY_CASES = {
    "garbage": (b"definitely not numpy", ["magic"]),
    "truncated-data": (_npy(np.ones((2, 3), np.float32))[:-8], ["truncated"]),
    "trailing-bytes": (_npy(np.ones((2, 3), np.float32)) + b"1234", ["after the data"]),
    "header-without-shape": (_npy_header("{'descr': '<f4', 'fortran_order': False, }"), ["'shape'"]),
    "header-unterminated": (_npy_header("{'descr': '<f4"), ["unterminated"]),
    "fortran-order": (_npy(np.asfortranarray(np.ones((2, 3), np.float32))), ["fortran_order"]),
    "big-endian": (_npy(np.ones((2, 3), ">f4")), ["big-endian"]),
    "complex": (_npy(np.ones((2, 3), np.complex64)), ["<c8"]),
    "claims-a-terabyte": (_npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", b"\0" * 16), ["truncated"]),
    "bool-byte-2": (_npy_header("{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }", b"\x01\x00\x02\x00\x01\x00"), ["byte value 2"]),
    "wrong-dtype": (_npy(np.ones((2, 3), np.float64)), ["'x'", "float64"]),
    "wrong-shape": (_npy(np.ones((3, 2), np.float32)), ["'x'", "[3,2]"]),
    "version-9": (b"\x93NUMPY\x09\x00" + b"\0" * 60, ["version 9"]),
}


# ---------------------------------------------------------------- .pb (onnx.TensorProto) inputs

def _pb(shape=(2, 3), dtype=np.float32, **edit):
    from onnx import numpy_helper

    t = numpy_helper.from_array(np.ones(shape, dtype), "x")
    if "dims" in edit:
        del t.dims[:]
        t.dims.extend(edit["dims"])
    if "raw" in edit:
        t.raw_data = edit["raw"]
    if "data_type" in edit:
        t.data_type = edit["data_type"]
    if "location" in edit:
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        e = t.external_data.add()
        e.key, e.value = "location", edit["location"]
    return t.SerializeToString()


PB_CASES = {
    "random-bytes": (b"\x12\xff\xff\xff\x0f garbage", ["not a serialized onnx.TensorProto"]),
    "truncated": (_pb()[:-5], ["not a serialized onnx.TensorProto"]),
    "huge-dims": (_pb(dims=[1 << 40, 1 << 30]), ["huge-dims.pb", "2^64 bytes"]),
    "negative-dim": (_pb(dims=[-2, 3]), ["negative dimension -2"]),
    "short-raw-data": (_pb(raw=b"\0" * 10), ["needs 24 bytes but raw_data holds 10"]),
    "string": (_pb(data_type=8), ["element type string"]),
    "type-99": (_pb(data_type=99), ["element type unknown (99)"]),
    "external-data-escapes": (_pb(location="../../etc/passwd"), ["'../../etc/passwd'", "leaves"]),
    "wrong-dtype": (_pb(data_type=onnx.TensorProto.INT4, raw=b"\0" * 3), ["'x'", "int4"]),
    "wrong-shape": (_pb(shape=(3, 2)), ["'x'", "[3,2]"]),
}


# .npy and .pb input files through `nnfuse run --input NAME=FILE`, the reader chosen by extension.
TENSOR_FILE_CASES = [("npy", c, *v) for c, v in NPY_CASES.items()] + [("pb", c, *v) for c, v in PB_CASES.items()]


@pytest.mark.parametrize("ext,case,data,needles", TENSOR_FILE_CASES, ids=[f"{e}-{c}" for e, c, *_ in TENSOR_FILE_CASES])
def test_malformed_tensor_file_input(tmp_path, ext, case, data, needles):
    m = save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2, 3])], [vi("y", [2, 3])])
    f = tmp_path / f"{case}.{ext}"
    f.write_bytes(data)
    assert_clear_error(nnfuse("run", m, "--target", "reference", "--input", f"x={f}"), *needles)


# ---------------------------------------------------------------- the kernel cache

def test_cache_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    m = _convnet(tmp_path, "net", 0.1)
    p = nnfuse("run", m, "--target", "host", "--no-profile", env={"NNFUSE_CACHE_DIR": str(blocker / "cache")})
    assert_clear_error(p, str(blocker / "cache"))


def test_two_processes_compile_into_one_cache_at_once(tmp_path):
    """Both compile the same model into the same, empty cache at the same time: both succeed and
    agree with the reference interpreter."""
    m = _convnet(tmp_path, "net", 0.1)
    env = {"NNFUSE_CACHE_DIR": str(tmp_path / "cache")}
    results = {}

    def compile_and_run(k):
        p = nnfuse("compile", m, "-o", tmp_path / f"art{k}", "--no-profile", env=env)
        q = nnfuse("run", tmp_path / f"art{k}", "--seed", "5", "--outputs", tmp_path / f"out{k}", env=env) if p.returncode == 0 else p
        results[k] = (p, q)

    threads = [threading.Thread(target=compile_and_run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, (p, q) in results.items():
        assert p.returncode == 0 and q.returncode == 0, p.stderr + q.stderr
    assert nnfuse("run", m, "--target", "reference", "--seed", "5", "--outputs", tmp_path / "ref").returncode == 0
    want = np.load(tmp_path / "ref" / "y.npy")
    for k in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"out{k}" / "y.npy"), want, rtol=1e-4, atol=1e-5)


def test_suite_size():
    """The issue asks for at least 60 malformed cases across the five kinds of input."""
    n = len(MODEL_CASES) + len(RULE_CASES) + 1 + len(PIPELINE_CASES) + 1 + len(ARTIFACT_CASES) + 2 + len(NPY_CASES) + 1
    assert n >= 60, n
