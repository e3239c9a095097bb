"""ONNX backend node tests on the GPU path through OpenCL (`nnfuse run --target mali-opencl`).

The sweep of node_conformance.py with `--target mali-opencl`: every node test the reference sweep
runs is optimized (pipeline auto), lowered, printed as OpenCL C (kernels/device) and run on the
first OpenCL device, PoCL's CPU device here; stages with no device form run on the host between
launches. Outputs are compared with the expected outputs shipped with each test (the same
tolerances as the host sweep). Every test runs (about 100 s cold on 2 cores; PoCL caches its
compiled kernels in ~/.cache/pocl). Environment: NNFUSE_CONFORMANCE_FILTER, NNFUSE_CONFORMANCE_JOBS.
"""
from __future__ import annotations

import ctypes
import os

import pytest

import node_conformance as nc

# Known failures on mali-opencl, each with the reason; a listed test that passes fails the suite.
OPENCL_EXPECTED_FAILURES: dict[str, str] = {}

# Tests whose op has a device form: they must run device kernels, not only host stages.
MUST_GENERATE = ("test_relu", "test_add_bcast", "test_gemm_all_attributes", "test_matmul_4d", "test_softmax_example",
                 "test_softmax_axis_0", "test_reduce_max_default_axes_keepdims_random", "test_xor_bcast4v3d",
                 "test_layer_normalization_2d_axis1_expanded", "test_logsoftmax_axis_0_expanded", "test_gather_0",
                 "test_conv_with_strides_padding", "test_maxpool_2d_default", "test_averagepool_2d_default",
                 "test_globalaveragepool")


def _opencl_available() -> bool:
    try:
        cl = ctypes.CDLL("libOpenCL.so.1")
    except OSError:
        return False
    n = ctypes.c_uint(0)
    return cl.clGetPlatformIDs(0, None, ctypes.byref(n)) == 0 and n.value > 0


pytestmark = pytest.mark.skipif(not _opencl_available() and not os.environ.get("CI"),
                                reason="no OpenCL platform (install pocl-opencl-icd); CI always runs this")


@pytest.fixture(scope="module")
def opencl_sweep(nnfuse_cli):
    jobs = int(os.environ.get("NNFUSE_CONFORMANCE_JOBS", "2"))
    tests = nc.discover(os.environ.get("NNFUSE_CONFORMANCE_FILTER"))
    results = nc.run_sweep(str(nnfuse_cli), jobs=jobs, target="mali-opencl", tests=tests)
    print("\n" + nc.summary_line(results))
    return results


def test_node_opencl_matches_expected_outputs(opencl_sweep):
    nc.assert_sweep_passes(opencl_sweep, "mali-opencl", OPENCL_EXPECTED_FAILURES)


def test_node_opencl_expected_failures_still_fail(opencl_sweep):
    nc.assert_expected_failures_still_fail(opencl_sweep, "mali-opencl", OPENCL_EXPECTED_FAILURES)


def test_node_opencl_generates_device_kernels(opencl_sweep):
    nc.assert_generated(opencl_sweep, MUST_GENERATE, "device kernel (all on the host)")
