"""The opset-23 LLM ops on host. The decompose-attention pass (rewrite/passes_decompose_attention.cpp)
turns the Attention forms it can into MatMul/Softmax/MatMul that run as fused attention; the
other forms (a KV cache, a fully masked constant row) keep the op's reference kernel.
decompose-rms-norm turns RMSNormalization into a reduction and elementwise ops the generator
lowers. Every case is checked against ONNX Runtime, which runs these ops natively."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import pytest
from onnx import TensorProto as TP

ort = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-4, 1e-5


def _model(inputs, outputs, attrs, inits=(), opset=23):
    node = h.make_node("Attention", [i for i, _ in inputs], [o for o in outputs], name="attn", **attrs)
    g = h.make_graph([node], "g", [h.make_tensor_value_info(n, TP.BOOL if n == "mask_in" else TP.FLOAT, s) for n, s in inputs if n not in {
        i.name for i in inits}], [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs if o], list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    return m


def _check(cli, tmp_path, m, feeds, decomposed: bool):
    path = tmp_path / "attn.onnx"
    onnx.save(m, path)
    want = dict(zip([o.name for o in m.graph.output], ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)))
    got = cli.run_model(path, feeds, tmp_path / "run", "--threads", "2", target="host", pipeline="auto")
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL, err_msg=f"output {name}")
    rep = cli.ok("optimize", path, "--target", "host")
    fired = rep["rules_fired"].get("decompose-attention", 0)
    assert (fired == 1) == decomposed, f"decompose-attention fired {fired} times"
    if decomposed:  # and the planner takes the result as one fused attention block
        assert rep["fusion_stats"]["attention_blocks"] == 1, rep["fusion_stats"]
    return rep


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_attention_4d_grouped_causal_is_decomposed(cli, tmp_path):
    rng = np.random.default_rng(0)
    feeds = {"q": _rand(rng, 2, 4, 10, 16), "k": _rand(rng, 2, 2, 10, 16), "v": _rand(rng, 2, 2, 10, 8)}
    m = _model([(n, list(a.shape)) for n, a in feeds.items()], ["y"], {"is_causal": 1})
    rep = _check(cli, tmp_path, m, feeds, decomposed=True)
    assert rep["network_class"] == "transformer_decoder"


def test_attention_3d_heads_constant_bool_mask_is_decomposed(cli, tmp_path):
    rng = np.random.default_rng(1)
    feeds = {"q": _rand(rng, 1, 6, 3 * 8), "k": _rand(rng, 1, 6, 3 * 8), "v": _rand(rng, 1, 6, 3 * 8)}
    mask = rng.random((6, 6)) > 0.3
    mask[:, 0] = True  # every query keeps a key
    init = onnx.numpy_helper.from_array(mask, "mask")
    m = _model([(n, list(a.shape)) for n, a in feeds.items()] + [("mask", [6, 6])], ["y"],
               {"q_num_heads": 3, "kv_num_heads": 3, "scale": 0.2}, inits=[init])
    _check(cli, tmp_path, m, feeds, decomposed=True)


def test_attention_fully_masked_row_keeps_the_op(cli, tmp_path):
    # A row with every key masked gives zeros from the op but NaN through a Softmax: not decomposed.
    rng = np.random.default_rng(2)
    feeds = {"q": _rand(rng, 1, 2, 4, 8), "k": _rand(rng, 1, 2, 5, 8), "v": _rand(rng, 1, 2, 5, 8)}
    mask = np.ones((4, 5), bool)
    mask[2, :] = False
    m = _model([(n, list(a.shape)) for n, a in feeds.items()] + [("mask", [4, 5])], ["y"], {}, inits=[onnx.numpy_helper.from_array(mask, "mask")])
    _check(cli, tmp_path, m, feeds, decomposed=False)


@pytest.mark.parametrize("mask_type", ["bool", "float"])
def test_attention_runtime_mask_is_decomposed_with_a_nan_guard(cli, tmp_path, mask_type):
    # A padding mask fed at run time, one query row fully masked: the op gives zeros there, and so
    # must the decomposed form (Where(IsNaN(p), 0, p) after the Softmax).
    rng = np.random.default_rng(4)
    feeds = {"q": _rand(rng, 1, 2, 5, 8), "k": _rand(rng, 1, 2, 6, 8), "v": _rand(rng, 1, 2, 6, 8)}
    keep = rng.random((1, 1, 5, 6)) > 0.3
    keep[0, 0, 3, :] = False
    feeds["mask_in"] = keep if mask_type == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    m = _model([(n, list(a.shape)) for n, a in feeds.items()], ["y"], {"is_causal": 0})
    if mask_type == "float":
        m.graph.input[3].type.tensor_type.elem_type = TP.FLOAT
    _check(cli, tmp_path, m, feeds, decomposed=True)


def test_attention_runtime_mask_and_cache_keep_the_op(cli, tmp_path):
    rng = np.random.default_rng(3)
    feeds = {"q": _rand(rng, 1, 2, 3, 8), "k": _rand(rng, 1, 2, 3, 8), "v": _rand(rng, 1, 2, 3, 8),
             "mask": (rng.random((3, 7)) * -2).astype(np.float32), "past_k": _rand(rng, 1, 2, 4, 8), "past_v": _rand(rng, 1, 2, 4, 8)}
    m = _model([(n, list(a.shape)) for n, a in feeds.items()], ["y", "present_k", "present_v"], {})
    _check(cli, tmp_path, m, feeds, decomposed=False)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization_is_decomposed_and_generated(cli, tmp_path, axis):
    rng = np.random.default_rng(5)
    x = _rand(rng, 2, 6, 32)
    scale = onnx.numpy_helper.from_array(_rand(rng, *([32] if axis == -1 else [6, 32])), "scale")
    node = h.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", axis=axis, epsilon=1e-6)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 6, 32])], [h.make_tensor_value_info("y", TP.FLOAT, [2, 6, 32])],
                     [scale])
    _check_generated(cli, tmp_path, h.make_model(g, opset_imports=[h.make_opsetid("", 23)]), x, "decompose-rms-norm")


def _check_generated(cli, tmp_path, m, x, pass_name):
    """One-input model `m` on host matches ONNX Runtime, runs no fallback block, and `pass_name` fired once."""
    path = tmp_path / "model.onnx"
    onnx.save(m, path)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.save(tmp_path / "x.npy", x)
    j = cli.ok("run", path, "--target", "host", "--input", f"x={tmp_path / 'x.npy'}", "--outputs", tmp_path / "out")
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), want, rtol=RTOL, atol=ATOL)
    assert j["compile"]["memory"]["fallback_blocks"] == 0, j["compile"]["memory"].get("fallback_reasons")
    rep = cli.ok("optimize", path, "--target", "host")
    assert rep["rules_fired"].get(pass_name) == 1


@pytest.mark.parametrize("three_d,interleaved,partial,positions", [(False, False, False, False), (True, True, True, True),
                                                                   (False, True, False, True), (True, False, True, False)])
def test_rotary_embedding_is_decomposed_and_generated(cli, tmp_path, three_d, interleaved, partial, positions):
    rng = np.random.default_rng(6)
    B, H, S, D = 2, 3, 5, 8
    R = 4 if partial else D
    x = _rand(rng, B, S, H * D) if three_d else _rand(rng, B, H, S, D)
    cache_shape = [11, R // 2] if positions else [B, S, R // 2]
    inits = [onnx.numpy_helper.from_array(np.cos(rng.random(cache_shape)).astype(np.float32), "cos"),
             onnx.numpy_helper.from_array(np.sin(rng.random(cache_shape)).astype(np.float32), "sin")]
    ins = ["x", "cos", "sin"]
    if positions:
        inits.append(onnx.numpy_helper.from_array(rng.integers(0, 11, (B, S)).astype(np.int64), "pos"))
        ins.append("pos")
    attrs = {"interleaved": int(interleaved), "rotary_embedding_dim": R if partial else 0}
    if three_d:
        attrs["num_heads"] = H
    node = h.make_node("RotaryEmbedding", ins, ["y"], name="rope", **attrs)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, list(x.shape))], [h.make_tensor_value_info("y", TP.FLOAT, list(x.shape))],
                     inits)
    _check_generated(cli, tmp_path, h.make_model(g, opset_imports=[h.make_opsetid("", 23)]), x, "decompose-rotary-embedding")
