"""Long-sequence transformer models for the peers benchmark (issue 22: a 1500-token encoder),
built with onnx.helper as the legacy PyTorch exporter writes a Whisper-tiny encoder's layers
(Whisper-tiny: d_model 384, 6 heads, FFN 1536, 4 layers, 1500 audio frames after its conv stem;
the stem is left out, its input is the stem's output). Random weights, seeded.

  encoder_1500: [1, 1500, 384] -> [1, 1500, 384]; attention as MatMul(Q, K^T) / sqrt(64),
  Softmax, MatMul(p, V) with the heads split and merged by Reshape/Transpose; pre-LayerNorm
  (opset 17 LayerNormalization), GELU through Erf.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def encoder(name: str = "encoder_1500", seq: int = 1500, d: int = 384, heads: int = 6, ffn: int = 1536, layers: int = 4,
            seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    dh = d // heads
    count = [0]

    def t(shape, scale=0.05):
        count[0] += 1
        n = f"w{count[0]}"
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), n))
        return n

    def c(value, dtype=np.float32):
        count[0] += 1
        n = f"c{count[0]}"
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), n))
        return n

    def op(kind, inputs, **attrs):
        count[0] += 1
        out = f"{kind}_{count[0]}"
        nodes.append(helper.make_node(kind, inputs, [out], name=out, **attrs))
        return out

    def linear(x, n_in, n_out):
        return op("Add", [op("MatMul", [x, t([n_in, n_out])]), t([n_out], 0.02)])

    def layer_norm(x):
        return op("LayerNormalization", [x, t([d], 0.1), t([d], 0.1)], axis=-1, epsilon=1e-5)

    def split_heads(x):
        return op("Transpose", [op("Reshape", [x, c([1, seq, heads, dh], np.int64)])], perm=[0, 2, 1, 3])

    x = "input_features"
    for _ in range(layers):
        h = layer_norm(x)
        q = split_heads(linear(h, d, d))
        k = split_heads(linear(h, d, d))
        v = split_heads(linear(h, d, d))
        kt = op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = op("Div", [op("MatMul", [q, kt]), c(np.sqrt(dh))])
        probs = op("Softmax", [scores], axis=-1)
        ctx = op("Transpose", [op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = op("Reshape", [ctx, c([1, seq, d], np.int64)])
        x = op("Add", [x, linear(ctx, d, d)])
        h = layer_norm(x)
        f = linear(h, d, ffn)
        gelu = op("Mul", [op("Mul", [f, op("Add", [op("Erf", [op("Div", [f, c(1.4142135)])]), c(1.0)])]), c(0.5)])
        x = op("Add", [x, linear(gelu, ffn, d)])
    nodes[-1].output[0] = "last_hidden_state"
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("input_features", TensorProto.FLOAT, [1, seq, d])],
                              [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    feeds = {"input_features": np.random.default_rng(seed + 1).standard_normal((1, seq, d)).astype(np.float32)}
    return model, feeds


BUILDERS = {"encoder_1500": encoder}
