#!/usr/bin/env bash
# Package checks, as a user meets nnfuse:
#   1. a fresh virtual environment, `pip install .` of this repository (scikit-build-core builds the
#      C++ core and the pybind11 module), then the pytest suite tests/python/test_python_api.py run
#      from outside the source tree against the installed package;
#   2. `cmake --install` of the C++ build into a temporary prefix, then examples/cpp configured with
#      find_package(nnfuse) against it, built and run on a zoo model;
#   3. the README quickstarts verbatim: the ```python quickstart and ```cpp quickstart blocks.
#
# Environment: PYTHON (default python3), BUILD_DIR (the C++ build to install; default build, built
# first when needed), NNFUSE_PKG_WORK (scratch dir; default a new /tmp dir, removed on success),
# NNFUSE_PIP_BUILD_DIR (scikit-build-core's build dir, kept between runs so a re-run only rebuilds
# what changed; default build-pip). ccache (on when installed) makes a fresh build dir cheap too.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache (used when installed, CMakeLists.txt) keys objects on paths relative to the repository
# (base_dir) and ignores the working folder, so a fresh clone in another folder (CI) reuses the
# objects any clone compiled from the same sources.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build}
PIP_BUILD_DIR=${NNFUSE_PIP_BUILD_DIR:-$REPO/build-pip}
WORK=${NNFUSE_PKG_WORK:-$(mktemp -d /tmp/nnfuse-pkg.XXXXXX)}
mkdir -p "$WORK"
T0=$(date +%s)
step() { echo "== test_package [$(( $(date +%s) - T0 )) s] $*"; }

# ---- 1. pip install into a fresh venv, pytest against site-packages ---------------------------------
step "fresh virtual environment: $WORK/venv"
rm -rf "$WORK/venv"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q --disable-pip-version-check numpy onnx onnxruntime pytest

step "pip install . (scikit-build-core; build dir $PIP_BUILD_DIR)"
# CMakeLists.txt puts ccache in front of the compiler when it is installed: objects the C++ build
# (scripts/setup.sh, same flags, same absolute source paths) already compiled are cache hits here.
"$VPY" -m pip install -q --disable-pip-version-check "$REPO" --config-settings=build-dir="$PIP_BUILD_DIR"

step "pytest against the installed package"
# The test file is copied out of the tree so nothing under the repository is importable.
mkdir -p "$WORK/pytest"
cp tests/python/test_python_api.py "$WORK/pytest/"
(cd "$WORK/pytest" && NNFUSE_REQUIRE_INSTALLED=1 "$VPY" -m pytest -q -p no:cacheprovider --durations=8 test_python_api.py)

# ---- 2. cmake --install + examples/cpp through find_package ----------------------------------------
step "C++ build ($BUILD_DIR) and cmake --install to $WORK/prefix"
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" >/dev/null
rm -rf "$WORK/prefix"
cmake --install "$BUILD_DIR" --prefix "$WORK/prefix" >/dev/null

step "examples/cpp: configure with find_package(nnfuse), build, run"
"$WORK/prefix/bin/nnfuse" zoo export resnet_tiny -o "$WORK/resnet_tiny.onnx" >/dev/null
cmake -S examples/cpp -B "$WORK/example" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/prefix" >/dev/null
cmake --build "$WORK/example" >/dev/null
"$WORK/example/nnfuse_example" "$WORK/resnet_tiny.onnx" reference

# ---- 3. README quickstarts, verbatim --------------------------------------------------------------
extract() {  # extract LANG OUT: the README's ```LANG quickstart block
  "$VPY" - "$1" "$2" <<'EOF'
import re, sys
lang, out = sys.argv[1], sys.argv[2]
text = open("README.md", encoding="utf-8").read()
blocks = re.findall(r"^```" + lang + r" quickstart[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
if len(blocks) != 1:
    sys.exit(f"README.md: expected one ```{lang} quickstart block, found {len(blocks)}")
open(out, "w", encoding="utf-8").write(blocks[0])
EOF
}
step "README Python quickstart"
mkdir -p "$WORK/quickstart"
extract python "$WORK/quickstart/quickstart.py"
(cd "$WORK/quickstart" && "$VPY" quickstart.py)

step "README C++ quickstart (runs where the Python one exported resnet_tiny.onnx)"
extract cpp "$WORK/quickstart/quickstart.cpp"
cmake -S examples/cpp -B "$WORK/quickstart/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/prefix" \
  -DNNFUSE_EXAMPLE_MAIN="$WORK/quickstart/quickstart.cpp" >/dev/null
cmake --build "$WORK/quickstart/build" >/dev/null
(cd "$WORK/quickstart" && ./build/nnfuse_example)

step "all package checks passed"
if [ -z "${NNFUSE_PKG_WORK:-}" ]; then rm -rf "$WORK"; fi
