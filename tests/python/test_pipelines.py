"""Per-class pipelines (rules/pipelines/*.pipeline) and `nnfuse tune-pipeline`.

- Every shipped pipeline parses, names only registered passes and runs (`nnfuse optimize
  --pipeline NAME` on a tiny model).
- Every zoo model (tiny, and the full-size ones not in SLOW_MODELS) with `--pipeline auto` gets its
  class's pipeline, the report lists the classifier's features, it gives no more kernels than
  `full`, and the rewritten model (--export-rewritten) runs in ONNX Runtime with the original's
  outputs.
- A wrong class (another class's pipeline forced with --pipeline NAME) still yields a correct model.
- tune-pipeline: baseline first, within budget, no more kernels than full, the best pipeline file
  runs and computes what the original does; usage and objective errors; quiet off a terminal.
"""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from conftest import assert_close, cli_path  # noqa: F401  (cli_path used by the zoo listing)
from test_zoo_ort import MODEL_TOLERANCES, SLOW_MODELS, TRANSFORMER_CLASSES, _zoo_list, make_inputs, run_ort

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted(p.stem for p in (ROOT / "rules" / "pipelines").glob("*.pipeline"))
CLASSES = ["residual_cnn", "mobile_cnn", "detector", "transformer_encoder", "transformer_decoder", "rnn"]
RTOL, ATOL = 1e-4, 1e-5


def _models(tiny_only: bool = False) -> list[dict]:
    out = []
    for m in _zoo_list():
        if m["name"] in SLOW_MODELS or (tiny_only and not m["tiny"]):
            continue
        for opset in ([13, 17] if m["network_class"] in TRANSFORMER_CLASSES else [13]):
            out.append(pytest.param(m, opset, id=f"{m['name']}-opset{opset}"))
    return out or [pytest.param(None, 13, id="zoo-unavailable")]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return {"dir": tmp_path_factory.mktemp("pipelines_zoo"), "files": {}}


def _export(cli, exports, model: dict, opset: int) -> Path:
    if model is None:
        pytest.fail(f"`nnfuse zoo list --json` gave no models (CLI at {cli_path()})", pytrace=False)
    key = (model["name"], opset)
    if key not in exports["files"]:
        path = exports["dir"] / f"{model['name']}_opset{opset}.onnx"
        cli.ok("zoo", "export", model["name"], "-o", path, "--opset", opset)
        exports["files"][key] = path
    return exports["files"][key]


def _check_rewritten(model_path: Path, rewritten: Path, description: str, name: str, what: str):
    original = onnx.load(str(model_path))
    feeds = make_inputs(original, description, seed=1)
    want = run_ort(model_path, feeds)
    got = run_ort(rewritten, feeds)
    rtol, atol = MODEL_TOLERANCES.get(name, (RTOL, ATOL, ""))[:2]
    assert set(got) == set(want), f"{what}: outputs {sorted(got)} != {sorted(want)}"
    for k in want:
        assert_close(got[k], want[k], rtol=rtol, atol=atol, what=f"{what}: output {k}")


def test_shipped_pipelines_exist_for_every_class():
    for c in CLASSES + ["full"]:
        assert c in PIPELINES, f"rules/pipelines/{c}.pipeline missing"
    full = [l.split()[1] for l in (ROOT / "rules/pipelines/full.pipeline").read_text().splitlines() if l.startswith("pass ")]
    for c in CLASSES:
        text = (ROOT / f"rules/pipelines/{c}.pipeline").read_text()
        steps = [l.split()[1] for l in text.splitlines() if l.startswith("pass ")]
        assert f"class {c}" in text
        # A subset of full, in full's order; user rules and fusion planning always run.
        assert steps == [p for p in full if p in steps], f"{c}: {steps} is not in full's order"
        assert "rules-user" in steps and steps[-1] == "fusion-plan", f"{c}: {steps}"
        assert len(steps) < len(full), f"{c} runs every pass of full: nothing was dropped"


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_shipped_pipeline_runs_on_a_tiny_model(cli, exports, pipeline):
    m = next(x for x in _zoo_list() if x["name"] == "resnet_tiny")
    path = _export(cli, exports, m, 13)
    rep = cli.ok("optimize", path, "--pipeline", pipeline, "--no-profile")
    assert rep["pipeline_name"] == pipeline
    assert rep["pipeline"][-1] == "fusion-plan"
    assert rep["kernels"] >= 1


@pytest.mark.parametrize("model,opset", _models())
def test_auto_picks_class_pipeline_and_stays_correct(cli, exports, workdir, model, opset):
    path = _export(cli, exports, model, opset)
    rewritten = workdir / "rewritten.onnx"
    auto = cli.ok("optimize", path, "--pipeline", "auto", "--no-profile", "--export-rewritten", rewritten)
    full = cli.ok("optimize", path, "--pipeline", "full", "--no-profile")
    cls = model["network_class"]
    assert auto["network_class"] == cls
    if cls == "generic":
        assert auto["pipeline_name"] == "full"
    else:
        # A hybrid runs its primary class's pipeline united with the secondary's ("a+b").
        assert auto["pipeline_name"].split("+")[0] == cls, auto["pipeline_name"]
    feats = auto["classification"]["features"]
    for key in ("convs", "depthwise_convs", "residual_joins", "attention_blocks", "causal_masks", "nms", "recurrent"):
        assert key in feats
    assert auto["classification"]["reasons"], "the report says why the class was chosen"
    assert auto["kernels"] <= full["kernels"], f"auto {auto['kernels']} kernels > full {full['kernels']}"
    _check_rewritten(path, rewritten, model["description"], model["name"], f"{model['name']} opset {opset} auto")


@pytest.mark.parametrize("model,opset", _models(tiny_only=True))
def test_wrong_class_pipeline_still_correct(cli, exports, workdir, model, opset):
    path = _export(cli, exports, model, opset)
    for other in CLASSES:
        if other == model["network_class"]:
            continue
        rewritten = workdir / f"as_{other}.onnx"
        rep = cli.ok("optimize", path, "--pipeline", other, "--no-profile", "--export-rewritten", rewritten)
        assert rep["pipeline_name"] == other
        _check_rewritten(path, rewritten, model["description"], model["name"], f"{model['name']} as {other}")


# ---- tune-pipeline


def _tiny(name: str) -> dict:
    return next(x for x in _zoo_list() if x["name"] == name)


def test_tune_pipeline_finds_no_worse_pipeline_and_it_is_correct(cli, exports, workdir):
    m = _tiny("bert_tiny")
    path = _export(cli, exports, m, 13)
    out = workdir / "best.pipeline"
    rep = cli.ok("tune-pipeline", path, "--budget", 10, "--seed", 3, "-o", out)
    full_passes = [l.split()[1] for l in (ROOT / "rules/pipelines/full.pipeline").read_text().splitlines() if l.startswith("pass ")]
    trials = rep["trials"]
    assert 1 <= len(trials) <= 10
    assert trials[0]["phase"] == "baseline" and trials[0]["passes"] + ["fusion-plan"] == full_passes
    assert all(t["ok"] for t in trials), [t["error"] for t in trials if not t["ok"]]
    assert rep["best"]["kernels"] <= rep["full"]["kernels"]
    assert rep["best"]["pipeline"][-1] == "fusion-plan"
    assert out.is_file() and "pipeline tuned" in out.read_text()

    # The tuned pipeline runs and computes what the original does (reference interpreter).
    opt = cli.ok("optimize", path, "--pipeline-file", out, "--no-profile")
    assert opt["kernels"] == rep["best"]["kernels"]
    # (the report also lists passes the manager inserted to satisfy requirements, e.g. infer-shapes)
    assert [p["name"] for p in opt["passes"] if not p["auto_inserted"]] == rep["best"]["pipeline"]
    feeds = make_inputs(onnx.load(str(path)), m["description"], seed=2)
    want = cli.run_model(path, feeds, workdir / "orig", pipeline="none")
    got = cli.run_model(path, feeds, workdir / "tuned", "--pipeline-file", out, pipeline="none")
    for k in want:
        assert_close(got[k], want[k], rtol=RTOL, atol=ATOL, what=f"tuned output {k}")


def test_tune_pipeline_seeded_and_quiet_off_a_terminal(cli, exports):
    path = _export(cli, exports, _tiny("resnet_tiny"), 13)
    a = cli.run_cli("tune-pipeline", path, "--budget", 8, "--seed", 11, "--json")
    b = cli.run_cli("tune-pipeline", path, "--budget", 8, "--seed", 11, "--json")
    assert a[0] == 0 and b[0] == 0
    assert a[2] == "" and b[2] == "", "progress goes to stderr only on a terminal"
    # The baseline and the random phase depend on the seed alone.
    n = 1 + round(8 * 0.3)
    assert [t["passes"] for t in a[1]["trials"][:n]] == [t["passes"] for t in b[1]["trials"][:n]]
    assert a[1]["best"]["kernels"] == b[1]["best"]["kernels"]
    text = cli.run_cli("tune-pipeline", path, "--budget", 4)
    assert text[0] == 0 and "kernels" in text[1] and "best: trial" in text[1] and "full:" in text[1]


def test_tune_pipeline_errors(cli, exports):
    path = _export(cli, exports, _tiny("resnet_tiny"), 13)
    rc, _, err = cli.run_cli("tune-pipeline", path, "--objective", "latency", "--target", "reference")
    assert rc == 1 and "compiled target" in err
    rc, _, err = cli.run_cli("tune-pipeline", path, "--objective", "speed")
    assert rc == 2 and "--objective" in err
    rc, _, err = cli.run_cli("tune-pipeline", path, "--budget", "0")
    assert rc == 2 and "--budget" in err


# ---- Framework-shaped exports (tests/python/test_framework_exports.py): the class pipelines were
# derived on the zoo, these check that they do not lose optimizations real exporters' idioms need
# (PyTorch's Shape->Gather->Concat->Reshape chains need shape-simplification and constant-folding).

from test_framework_exports import CASE_BUILDERS, shape_args  # noqa: E402


@pytest.mark.parametrize("name", sorted(CASE_BUILDERS))
def test_framework_exports_auto_no_more_kernels_than_full_and_correct(cli, workdir, name):
    ec = CASE_BUILDERS[name]()
    path = workdir / f"{ec.name}.onnx"
    onnx.save(ec.model, str(path))
    rewritten = workdir / "rewritten.onnx"
    auto = cli.ok("optimize", path, "--pipeline", "auto", "--no-profile", *shape_args(ec), "--export-rewritten", rewritten)
    full = cli.ok("optimize", path, "--pipeline", "full", "--no-profile", *shape_args(ec))
    assert auto["kernels"] <= full["kernels"], f"{name}: auto ({auto['pipeline_name']}) {auto['kernels']} kernels > full {full['kernels']}"
    want = run_ort(path, ec.feeds)
    got = run_ort(rewritten, ec.feeds)
    for k in want:
        assert_close(got[k], want[k], rtol=RTOL, atol=ATOL, what=f"{name} auto: output {k}")


@pytest.mark.parametrize("flag", [True, False])
def test_if_on_a_constant_condition_is_inlined(cli, tmp_path, flag):
    # cond = Equal(16000, 16000 or 8000), two constants: constant folding evaluates it, then the
    # If becomes the branch it takes (its Constant node folded too); outputs as ONNX Runtime's.
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as TP, helper as h, numpy_helper as nh

    def branch(op, name):
        c = h.make_node("Constant", [], [f"{name}_c"], value=nh.from_array(np.array(2.0, np.float32)))
        return h.make_graph([c, h.make_node(op, ["x"], [f"{name}_r"]), h.make_node("Mul", [f"{name}_r", f"{name}_c"], [f"{name}_y"])],
                            name, [], [h.make_tensor_value_info(f"{name}_y", TP.FLOAT, None)])

    nodes = [h.make_node("Equal", ["sr", "want"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], then_branch=branch("Relu", "then"), else_branch=branch("Neg", "else")),
             h.make_node("Add", ["y", "x"], ["out"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [h.make_tensor_value_info("out", TP.FLOAT, [2, 3])],
                     [nh.from_array(np.array(16000, np.int64), "sr"), nh.from_array(np.array(16000 if flag else 8000, np.int64), "want")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 16)])
    path, out = tmp_path / "if.onnx", tmp_path / "if_inlined.onnx"
    onnx.save(m, path)
    rep = cli.ok("optimize", path, "--export-rewritten", out, "--verify")
    assert rep["rules_fired"].get("inline-constant-if") == 1, rep["rules_fired"]
    r = onnx.load(str(out))
    onnx.checker.check_model(r, full_check=True)
    assert "If" not in {n.op_type for n in r.graph.node}
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(ort.InferenceSession(r.SerializeToString()).run(None, {"x": x})[0], want)
    got = cli.run_model(path, {"x": x}, tmp_path / "run", target="reference", pipeline="auto")["out"]
    np.testing.assert_allclose(got, want)
