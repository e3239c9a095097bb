#!/usr/bin/env python3
"""Writes a generated N-node ONNX model for planner/rewrite scaling benchmarks.

The graph repeats a residual MLP block of 8 operators, as deep networks do:
    h = Relu(MatMul(x, W) + b); y = x + h * s; (Identity, Neg∘Neg pairs give rewrites work)
Usage: python3 bench/gen_large_graph.py OUT.onnx [--nodes 100000] [--width 16]
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(nodes: int, width: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32), "W"),
             numpy_helper.from_array(np.zeros(width, np.float32), "b"),
             numpy_helper.from_array(np.array(0.5, np.float32), "s")]
    graph_nodes = []
    cur = "x"
    i = 0
    while len(graph_nodes) + 8 <= nodes:
        p = f"l{i}_"
        graph_nodes += [
            helper.make_node("MatMul", [cur, "W"], [p + "mm"]),
            helper.make_node("Add", [p + "mm", "b"], [p + "ab"]),
            helper.make_node("Relu", [p + "ab"], [p + "r"]),
            helper.make_node("Identity", [p + "r"], [p + "id"]),
            helper.make_node("Neg", [p + "id"], [p + "n1"]),
            helper.make_node("Neg", [p + "n1"], [p + "n2"]),
            helper.make_node("Mul", [p + "n2", "s"], [p + "sc"]),
            helper.make_node("Add", [cur, p + "sc"], [p + "out"]),
        ]
        cur = p + "out"
        i += 1
    g = helper.make_graph(graph_nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, width])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--nodes", type=int, default=100000)
    ap.add_argument("--width", type=int, default=16)
    a = ap.parse_args()
    m = build(a.nodes, a.width)
    onnx.save(m, a.out)
    print(f"wrote {a.out}: {len(m.graph.node)} nodes")


if __name__ == "__main__":
    main()
