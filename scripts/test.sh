#!/usr/bin/env bash
# Runs the whole test suite: installs and builds first (scripts/setup.sh), then the Catch2 tests
# through CTest and the pytest suites (registered with CTest), then the package checks
# (scripts/test_package.sh: pip install into a fresh venv, pytest against the installed package,
# cmake --install + find_package consumer, README quickstarts verbatim).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== test: setup and build took $SECONDS s"
BUILD_DIR=${BUILD_DIR:-build}
start=$SECONDS
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" "$@")
echo "== test: ctest took $((SECONDS - start)) s"
start=$SECONDS
bash scripts/test_package.sh
echo "== test: package checks took $((SECONDS - start)) s"
