"""Writes the tiny malformed ONNX models in this folder (run once; the outputs are committed).

Each file is broken in exactly one way, so that a test (C++ or CLI/pytest) can check that the
error names what is at fault. The C++ suite (tests/cpp/graph/test_onnx_io.cpp) builds the same
cases in memory; these files are for tests that go through the command line.
"""
import os
import random

import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))


def vi(name, dims=(2,)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def model(nodes, opset=17, ir=8, inputs=("x",), outputs=("y",)):
    g = helper.make_graph(nodes, "malformed", [vi(i) for i in inputs], [vi(o) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="make_malformed")
    m.ir_version = ir
    return m.SerializeToString()


def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)


good = model([helper.make_node("Relu", ["x"], ["y"], name="relu")])
write("valid_relu.onnx", good)
write("empty.onnx", b"")
write("truncated.onnx", good[: len(good) // 2])
rng = random.Random(1234)
write("random_bytes.onnx", bytes([0xFF, 0xFF, 0xFF, 0xFF]) + bytes(rng.randrange(256) for _ in range(60)))
write("cycle.onnx", model([
    helper.make_node("Relu", ["b"], ["a"], name="cycle_a"),
    helper.make_node("Relu", ["a"], ["b"], name="cycle_b"),
    helper.make_node("Identity", ["x"], ["y"], name="out"),
]))
write("dangling_edge.onnx", model([
    helper.make_node("Relu", ["x"], ["y"], name="relu"),
    helper.make_node("Relu", ["ghost"], ["z"], name="haunted"),
]))
write("unknown_op.onnx", model([helper.make_node("FooBar", ["x"], ["y"], name="foo_node")]))
write("wrong_arity.onnx", model([helper.make_node("Relu", ["x", "x"], ["y"], name="two_inputs")]))
write("opset6.onnx", model([helper.make_node("Relu", ["x"], ["y"], name="relu")], opset=6, ir=3))
write("ir2.onnx", model([helper.make_node("Relu", ["x"], ["y"], name="relu")], ir=2))
