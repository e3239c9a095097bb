"""The opset-23 Attention op: the decompose-attention pass (rewrite/passes_decompose_attention.cpp)
turns the forms it can into MatMul/Softmax/MatMul that run as fused attention on host; the other
forms (a cache, a mask computed at run time) keep the op's reference kernel. Every case is
checked against ONNX Runtime, which runs the op natively."""
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
