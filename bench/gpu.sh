#!/usr/bin/env bash
# The GPU steps of the device targets in one command, for a machine with an NVIDIA GPU (issue 17):
#   1. the CUDA backend's own test (a program built with NVRTC for the device's architecture and
#      run through the driver API) and the device test suite, where the test binary is present;
#   2. bench/gpu_check.py --target volta-cuda: every tiny zoo model, full-size zoo models and every
#      framework-shaped export of the test suite against ONNX Runtime, with latencies;
#   3. --profile of ResNet-50 and BERT-base, and PyTorch eager on the same GPU as a peer
#      (bench/gpu_torch_peer.py) where PyTorch is installed.
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
work=${NNFUSE_GPU_WORK:-/tmp/nnfuse_gpu_work}  # models and outputs; results go to $out
mkdir -p "$work"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
if [ -x "$tests" ]; then
  (cd "$here" && "$tests" "[cuda]" 2>&1 | tail -15)
fi
cd "$here" && python3 bench/gpu_check.py --target volta-cuda --out "$work" "$@" 2>&1 | grep -v '^{'
cp "$work/gpu_check.json" "$work/gpu_check.md" "$out/" 2>/dev/null
# Per-stage times of two full-size models (--profile waits after every stage).
for m in resnet50 bert_base; do
  [ -f "$work/$m.onnx" ] && "$NNFUSE_CLI" run "$work/$m.onnx" --target volta-cuda --profile --json > "$out/profile_$m.json" 2>&1
done
# PyTorch eager on the same GPU, where it is installed (ONNX Runtime's CUDA EP may not be).
if python3 -c "import torch, torchvision" 2>/dev/null; then
  python3 bench/gpu_torch_peer.py --out "$out" 2>&1 | tail -8
fi
