"""ONNX backend node tests on the generated-kernel path (`nnfuse run --target host`).

The sweep of node_conformance.py with `--target host`: every node test the reference sweep runs
is optimized (pipeline auto), lowered, compiled to C++ kernels with the system compiler and run,
and its outputs are compared with the expected outputs shipped with the test (float32: 1e-4
relative, 1e-5 absolute, or the named looser bounds in node_conformance.OP_TOLERANCES /
DTYPE_TOLERANCES). Blocks whose ops have no lowering run as fallback stages (reference kernels)
inside the compiled model; each result records how many generated stages ran.

Budget: compiling costs about 0.3 s of CPU per test that generates kernels (the support header
is precompiled once per compiler and flags, see docs/codegen.md), so the default run takes a
cross-section: the first test of every op label (node_conformance.select_per_op) plus
MUST_GENERATE and ALWAYS_RUN. NNFUSE_TEST_FULL=1 (set in CI) runs every test. Kernels are
cached in $NNFUSE_CACHE_DIR (default ~/.cache/nnfuse/kernels), so a second run is fast.
Environment: NNFUSE_CONFORMANCE_FILTER (regex on test names), NNFUSE_CONFORMANCE_JOBS (default 2).
"""
from __future__ import annotations

import os

import pytest

import node_conformance as nc

# Known failures on host, each with the reason. A listed test that passes fails this suite (the
# entry must then be removed), so the list cannot go stale silently.
HOST_EXPECTED_FAILURES: dict[str, str] = {}

# Tests that found bugs outside the kernels, always part of the sweep (also in the cheap default
# run, which otherwise takes one test per op label). The expanded AffineGrid tests read outer
# values inside If branches: fusion blocks must order and write out what a body reads, and the
# rewrites once removed a Slice of a shape vector of unknown length (docs/conformance.md).
ALWAYS_RUN = ("test_affine_grid_2d_expanded", "test_affine_grid_2d_align_corners_expanded",
              "test_affine_grid_3d_expanded", "test_affine_grid_3d_align_corners_expanded")

# Tests whose op has a lowering: they must run generated kernels (not fall back), so a lowering
# that silently stops applying is caught. Always part of the sweep, also in the cheap default run.
# (Conv and pooling node tests are opset 22; the Attention op reaches fused attention through the
# decompose-attention pass.)
MUST_GENERATE = ("test_relu", "test_add_bcast", "test_gemm_all_attributes", "test_matmul_4d",
                 "test_softmax_example", "test_reduce_max_default_axes_keepdims_random", "test_xor_bcast4v3d",
                 "test_conv_with_strides_padding", "test_maxpool_2d_default", "test_attention_4d_causal")


@pytest.fixture(scope="module")
def host_sweep(nnfuse_cli):
    jobs = int(os.environ.get("NNFUSE_CONFORMANCE_JOBS", "2"))
    tests = nc.discover(os.environ.get("NNFUSE_CONFORMANCE_FILTER"))
    if os.environ.get("NNFUSE_TEST_FULL") != "1":
        tests = nc.select_per_op(tests, per_op=1, always=MUST_GENERATE + ALWAYS_RUN)
    results = nc.run_sweep(str(nnfuse_cli), jobs=jobs, target="host", tests=tests)
    print("\n" + nc.summary_line(results))
    return results


def test_node_host_matches_expected_outputs(host_sweep):
    nc.assert_sweep_passes(host_sweep, "host", HOST_EXPECTED_FAILURES)


def test_node_host_expected_failures_still_fail(host_sweep):
    nc.assert_expected_failures_still_fail(host_sweep, "host", HOST_EXPECTED_FAILURES)


def test_node_host_generates_kernels(host_sweep):
    nc.assert_generated(host_sweep, MUST_GENERATE, "generated kernel (all fallback)")
    # Every attempted test went through the compiled model (the report carries its stage counts).
    for r in host_sweep:
        if r.status == "passed":
            assert r.generated is not None, f"{r.name}: no compile report; did it run on host at all?"
