#!/usr/bin/env bash
# Runs the whole test suite: installs and builds first (scripts/setup.sh), then the Catch2 tests
# through CTest and the pytest suites (also registered with CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
