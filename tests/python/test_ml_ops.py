"""Classic-ML ops (graph/ops_ml.cpp) against ONNX Runtime: TreeEnsemble with every aggregation
and post-transform over mixed node modes, set membership and missing values; TfIdfVectorizer in
IDF and TFIDF modes with weights (the node tests cover TF only); Binarizer and
ArrayFeatureExtractor. Reference interpreter and `--target host` (fallback stages there).

ONNX Runtime 1.23 numbers TreeEnsemble's post_transform by its own enum (1 logistic, 2 softmax)
where the spec says 1 SOFTMAX, 2 LOGISTIC: we follow the spec, so ORT is given the swapped value.
And its SOFTMAX_ZERO of a row of zeros is NaN (0 / 0), ours that row of zeros.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import test_zoo_ort as zoo
from conftest import assert_close

ORT_POST = {0: 0, 1: 2, 2: 1, 3: 3}  # spec's post_transform -> the value ORT reads as the same


def _tree_ensemble(path, agg, post, dtype):
    npdt = np.float32 if dtype == T.FLOAT else np.float64
    # Two trees over 3 features and 3 targets: node 0 LEQ, 1 LT, 2 GTE (tree 0); 3 GT, 4 MEMBER
    # {1, 2}, 5 EQ 7 (tree 1); NaN goes the true way at nodes 0 and 3.
    node = h.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml",
        nodes_splits=nh.from_array(np.array([0.5, -0.2, 1.0, 0.3, 0.0, 7.0], npdt)),
        nodes_featureids=[0, 1, 2, 2, 1, 0],
        nodes_modes=nh.from_array(np.array([0, 1, 2, 3, 6, 4], np.uint8)),
        nodes_truenodeids=[1, 0, 1, 5, 2, 4], nodes_trueleafs=[0, 1, 1, 0, 1, 1],
        nodes_falsenodeids=[2, 1, 2, 4, 3, 5], nodes_falseleafs=[0, 1, 1, 0, 1, 1],
        nodes_missing_value_tracks_true=[1, 0, 0, 1, 0, 0],
        membership_values=nh.from_array(np.array([1.0, 2.0, np.nan], npdt)),
        leaf_targetids=[0, 1, 2, 0, 1, 2], leaf_weights=nh.from_array(np.array([1.5, -2.0, 0.25, 3.0, 0.0, -1.0], npdt)),
        tree_roots=[0, 3], n_targets=3, aggregate_function=agg, post_transform=post)
    g = h.make_graph([node], "te", [h.make_tensor_value_info("X", dtype, [None, 3])], [h.make_tensor_value_info("Y", dtype, [None, 3])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("ai.onnx.ml", 5)], ir_version=10), str(path))


@pytest.mark.parametrize("agg", [0, 1, 2, 3], ids=["average", "sum", "min", "max"])
@pytest.mark.parametrize("post", [0, 1, 2, 3], ids=["none", "softmax", "logistic", "softmax_zero"])
def test_tree_ensemble_matches_ort(cli, workdir, agg, post):
    rng = np.random.default_rng(agg * 4 + post)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    x[::7, 0] = np.nan  # missing values
    x[::3, 1] = 1.0     # set members
    x[::4, 0] = 7.0     # the EQ split
    _tree_ensemble(workdir / "te.onnx", agg, post, T.FLOAT)
    _tree_ensemble(workdir / "te_ort.onnx", agg, ORT_POST[post], T.FLOAT)
    want = zoo.run_ort(workdir / "te_ort.onnx", {"X": x})["Y"]
    if post == 3:
        # SOFTMAX_ZERO of a row of zeros: ORT divides 0 by 0 (NaN); we leave the zeros.
        want[np.isnan(want).all(axis=1)] = 0
    for target in ("reference", "host"):
        got = cli.run_model(workdir / "te.onnx", {"X": x}, workdir / target, target=target, pipeline="auto")["Y"]
        assert_close(got, want, 1e-5, 1e-6, what=f"TreeEnsemble aggregate {agg} post_transform {post} on {target}")


def test_tree_ensemble_in_double_and_errors(cli, workdir):
    # float64 X against float64 splits, compared without rounding to float (1.2 <= 1.2 exactly).
    x = np.array([[1.2, 0.0, 1.0], [0.5, 2.0, -1.0]], np.float64)
    _tree_ensemble(workdir / "te64.onnx", 1, 0, T.DOUBLE)
    want = zoo.run_ort(workdir / "te64.onnx", {"X": x})["Y"]
    got = cli.run_model(workdir / "te64.onnx", {"X": x}, workdir)["Y"]
    assert got.dtype == np.float64
    assert_close(got, want, 0, 1e-12, what="TreeEnsemble float64")
    m = onnx.load(str(workdir / "te64.onnx"))
    for a in m.graph.node[0].attribute:
        if a.name == "nodes_truenodeids":
            a.ints[0] = 9  # past the 6 nodes
    onnx.save(m, str(workdir / "bad.onnx"))
    rc, _, err = cli("run", workdir / "bad.onnx", "--target", "reference")
    assert rc != 0 and "node 0 branches to node 9 of 6" in err and "TreeEnsemble" in err, err


@pytest.mark.parametrize("mode", ["IDF", "TFIDF"])
def test_tfidf_weights_match_ort(cli, workdir, mode):
    node = h.make_node("TfIdfVectorizer", ["x"], ["y"], mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2,
                       ngram_counts=[0, 4, 8], ngram_indexes=list(range(7)),
                       pool_int64s=[2, 3, 5, 4, 2, 3, 5, 4, 2, 3, 5], weights=[0.5, 1.0, 2.0, 0.1, 3.0, 0.2, 1.5])
    g = h.make_graph([node], "tfidf", [h.make_tensor_value_info("x", T.INT64, [4, 12])], [h.make_tensor_value_info("y", T.FLOAT, [4, 7])])
    path = workdir / "tfidf.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 9)], ir_version=8), str(path))
    x = np.random.default_rng(5).integers(2, 6, (4, 12)).astype(np.int64)
    want = zoo.run_ort(path, {"x": x})["y"]
    got = cli.run_model(path, {"x": x}, workdir)["y"]
    assert_close(got, want, 0, 0, what=f"TfIdfVectorizer {mode}")


def test_binarizer_and_feature_extractor_match_ort(cli, workdir):
    nodes = [h.make_node("Binarizer", ["x"], ["b"], domain="ai.onnx.ml", threshold=0.1),
             h.make_node("ArrayFeatureExtractor", ["b", "i"], ["y"], domain="ai.onnx.ml")]
    g = h.make_graph(nodes, "ml", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 6])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [h.make_tensor("i", T.INT64, [4], [5, 0, 5, 2])])
    path = workdir / "ml.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 3)], ir_version=8), str(path))
    x = np.random.default_rng(9).standard_normal((2, 3, 6)).astype(np.float32)
    want = zoo.run_ort(path, {"x": x})["y"]
    got = cli.run_model(path, {"x": x}, workdir)["y"]
    assert got.shape == (2, 3, 4)
    assert_close(got, want, 0, 0, what="Binarizer + ArrayFeatureExtractor")
