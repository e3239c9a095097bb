#!/usr/bin/env bash
# Installs every dependency nnfuse needs (idempotent), configures and builds it.
#   bash scripts/setup.sh          install + build
#   bash scripts/setup.sh --demo   install + build + run `nnfuse demo`
# BUILD_DIR (default: build) and BUILD_TYPE (default: Release) may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache (used when installed, CMakeLists.txt) keys objects on paths relative to the repository
# (base_dir) and ignores the working folder, so a fresh clone in another folder (CI) reuses the
# objects any clone compiled from the same sources.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}

DEBIAN_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libboost-graph-dev libprotobuf-dev protobuf-compiler libonnx-dev
  libxsimd-dev xtl-dev catch2 pybind11-dev nlohmann-json3-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  g++-aarch64-linux-gnu qemu-user
)
PYTHON_PACKAGES=(onnx onnxruntime numpy pytest scikit-build-core)

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import onnx, onnxruntime, numpy, pytest" 2>/dev/null; then
  echo "setup: installing Python packages: ${PYTHON_PACKAGES[*]}"
  "$PYTHON" -m pip install -q "${PYTHON_PACKAGES[@]}"
fi
# NVRTC 12.x: compiles the volta-cuda target's CUDA C for sm_70 with no GPU (the tests check every
# tiny zoo model's kernels with it; the system CUDA 13 toolkit no longer targets sm_70).
if ! "$PYTHON" -c "import nvidia.cuda_nvrtc" 2>/dev/null; then
  echo "setup: installing Python package: nvidia-cuda-nvrtc-cu12"
  "$PYTHON" -m pip install -q "nvidia-cuda-nvrtc-cu12>=12.4,<13"
fi

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DPython3_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"

if [ "${1:-}" = "--demo" ]; then
  "$BUILD_DIR/bindings/nnfuse" demo
fi
