#!/usr/bin/env bash
# The GPU steps of the device targets in one command, for a machine with an NVIDIA GPU (issue 17):
#   1. the CUDA backend's own test (a program built with NVRTC for the device's architecture and
#      run through the driver API) and the device test suite, where the test binary is present;
#   2. bench/gpu_check.py --target volta-cuda: every tiny zoo model, full-size zoo models and every
#      framework-shaped export of the test suite against ONNX Runtime, with latencies.
# Needs: the nnfuse CLI (build/bindings/nnfuse, or a folder .gpu/ holding nnfuse, test_device and
# the shared libraries they need, as a machine without the build dependencies gets it), an NVIDIA
# driver (libcuda.so.1), NVRTC (pip install nvidia-cuda-nvrtc-cu12, or the toolkit's), and Python
# with numpy, onnx and onnxruntime.
#   bash bench/gpu.sh [OUTDIR] [extra gpu_check.py arguments]
set -u
out=${1:-/tmp/gpu_check}
shift || true
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$here/.gpu/nnfuse" ]; then
  export LD_LIBRARY_PATH="$here/.gpu:${LD_LIBRARY_PATH:-}"
  export NNFUSE_CLI="$here/.gpu/nnfuse"
  tests="$here/.gpu/test_device"
else
  export NNFUSE_CLI="${NNFUSE_CLI:-$here/build/bindings/nnfuse}"
  tests="$here/build/tests/test_device"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
if [ -x "$tests" ]; then
  (cd "$here" && "$tests" "[cuda]" 2>&1 | tail -15) | tee "$out/test_cuda.txt"
fi
cd "$here" && python3 bench/gpu_check.py --target volta-cuda --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log" | grep -v '^{'
