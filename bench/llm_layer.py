"""Writes one Llama-style decoder layer at opset 23 (RMSNormalization, RotaryEmbedding, Attention,
SwiGLU MLP as Sigmoid/Mul; random weights) and an input, for timing nnfuse against ONNX Runtime on
the opset-23 LLM ops (bench/RESULTS.md, session 17):

    python3 bench/llm_layer.py --out /tmp/llm    # llm_layer23.onnx and x.npy
    nnfuse compile /tmp/llm/llm_layer23.onnx -o /tmp/llm/art
    nnfuse run /tmp/llm/art --input x=/tmp/llm/x.npy --threads 1 --runs 100
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as h
from onnx import TensorProto as TP
from onnx import numpy_helper as nh


def build(seq: int = 128, heads: int = 12, head_size: int = 64, ffn: int = 2048, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    E, half = heads * head_size, head_size // 2
    inits, nodes = [], []

    def weight(name, *shape):
        inits.append(nh.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name))
        return name

    angles = np.arange(seq)[:, None] / 10000 ** (np.arange(half) / half)[None, :]
    inits += [nh.from_array(np.cos(angles).astype(np.float32)[None], "cos"), nh.from_array(np.sin(angles).astype(np.float32)[None], "sin")]
    nodes.append(h.make_node("RMSNormalization", ["x", weight("g1", E)], ["n1"], epsilon=1e-6))
    for p in "qkv":
        nodes.append(h.make_node("MatMul", ["n1", weight("W" + p, E, E)], [p]))
    for p in "qk":
        nodes.append(h.make_node("RotaryEmbedding", [p, "cos", "sin"], [p + "r"], num_heads=heads))
    nodes.append(h.make_node("Attention", ["qr", "kr", "v"], ["a"], q_num_heads=heads, kv_num_heads=heads, is_causal=1))
    nodes.append(h.make_node("MatMul", ["a", weight("Wo", E, E)], ["o"]))
    nodes.append(h.make_node("Add", ["x", "o"], ["r1"]))
    nodes.append(h.make_node("RMSNormalization", ["r1", weight("g2", E)], ["n2"], epsilon=1e-6))
    nodes.append(h.make_node("MatMul", ["n2", weight("Wg", E, ffn)], ["gate"]))
    nodes.append(h.make_node("MatMul", ["n2", weight("Wu", E, ffn)], ["up"]))
    nodes.append(h.make_node("Sigmoid", ["gate"], ["sg"]))
    nodes.append(h.make_node("Mul", ["gate", "sg"], ["silu"]))
    nodes.append(h.make_node("Mul", ["silu", "up"], ["m"]))
    nodes.append(h.make_node("MatMul", ["m", weight("Wd", ffn, E)], ["down"]))
    nodes.append(h.make_node("Add", ["r1", "down"], ["y"]))
    g = h.make_graph(nodes, "llm_layer", [h.make_tensor_value_info("x", TP.FLOAT, [1, seq, E])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, seq, E])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 23)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for llm_layer23.onnx and x.npy")
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    m = build(seq=a.seq)
    onnx.save(m, out / "llm_layer23.onnx")
    np.save(out / "x.npy", np.random.default_rng(1).standard_normal((1, a.seq, 768)).astype(np.float32))


if __name__ == "__main__":
    main()
