#!/usr/bin/env bash
# The sanitizer jobs of CI (docs/reliability.md), each on a subset of the suite:
#   asan  clang build with AddressSanitizer + UndefinedBehaviorSanitizer (build-fuzz/, the same
#         build as the fuzz targets): the Catch2 suites, with the generated kernels compiled by
#         clang with -fsanitize=address,undefined and loaded into the sanitized process; the tiny
#         zoo models compiled and run by the sanitized CLI against its reference interpreter; a
#         node-test subset through the sanitized CLI.
#   tsan  ThreadSanitizer build (build-tsan/): the thread-pool and concurrent-run() tests, the
#         generated kernels built with -fsanitize=thread.
#   fuzz  every fuzz target for --seconds (scripts/fuzz.sh).
#
#   bash scripts/sanitize.sh [asan] [tsan] [fuzz] [--seconds N]     (default: all three, 30 s)
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache (used when installed, CMakeLists.txt) keys objects on paths relative to the repository
# (base_dir) and ignores the working folder, so a fresh clone in another folder (CI) reuses the
# objects any clone compiled from the same sources.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
JOBS_WANTED=()
FUZZ_SECONDS=30
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) FUZZ_SECONDS=$2; shift 2 ;;
    asan|tsan|fuzz) JOBS_WANTED+=("$1"); shift ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ ${#JOBS_WANTED[@]} -gt 0 ]] || JOBS_WANTED=(asan tsan fuzz)
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
# Sanitized kernels do not share the ordinary cache; no precompiled header (clang does not read
# g++'s); every UBSan finding is fatal (the library is built with -fno-sanitize-recover). They are
# compiled at -O1 (after the generator's -O3, so it wins), as the sanitizers' documentation
# advises: clang takes several times longer on the unrolled -O3 tiles under instrumentation, and
# every access the kernels make is still checked.
export NNFUSE_CXX=clang++ NNFUSE_PCH=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
CATCH_SUITES='^(graph|rewrite|fusion|lowering|kernels|fuzz)/'  # fuzz/: the fuzz regressions, replayed
# Cross-compiled programs run under qemu (not ours to sanitize); the full-size zoo models take
# minutes each under ASan and their tiny forms run the same code; the precompiled-header test
# needs the PCH this job turns off (clang does not read g++'s); the measured conv-algorithm test
# times candidate kernels (two minutes under ASan) that the forced-modes test already runs.
NOT_UNDER_SANITIZERS='arm-neon|aarch64|qemu|full-size|every zoo model is classified|precompiled|measured on this machine'

run_asan() {
  local b=build-fuzz
  cmake -S . -B $b -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNNFUSE_FUZZ=ON -DNNFUSE_BUILD_TESTS=ON -DNNFUSE_ARM_SELFTEST=OFF >/dev/null
  ninja -C $b test_graph test_rewrite test_fusion test_kernels test_lowering mk_selftest_avx512 nnfuse \
    replay_onnx_import replay_model replay_npy replay_rules replay_pipeline replay_artifact
  export NNFUSE_CACHE_DIR=$PWD/$b/kernel-cache NNFUSE_KERNEL_CXXFLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=all"
  (cd $b && ctest -R "$CATCH_SUITES" -E "$NOT_UNDER_SANITIZERS" -j "$(nproc)" --output-on-failure --timeout 1500)
  echo "== asan: tiny zoo models, sanitized kernels against the sanitized reference interpreter"
  local cli=$b/bindings/nnfuse work=$b/zoo-check
  rm -rf $work && mkdir -p $work
  for m in resnet_tiny mobilenet_tiny efficientnet_tiny ssd_tiny bert_tiny gpt2_tiny vit_tiny lstm_tiny; do
    $cli zoo export $m -o $work/$m.onnx >/dev/null
    $cli run $work/$m.onnx --target reference --seed 3 --outputs $work/$m.ref >/dev/null
    $cli run $work/$m.onnx --target host --threads 2 --seed 3 --outputs $work/$m.host >/dev/null
    python3 - "$work/$m.ref" "$work/$m.host" "$m" <<'PY'
import sys, pathlib, numpy as np
ref, got, name = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
for f in sorted(ref.glob("*.npy")):
    a, b = np.load(f), np.load(got / f.name)
    if a.shape != b.shape or (a.dtype.kind == "f" and not np.allclose(a, b, rtol=1e-3, atol=1e-4)) or (a.dtype.kind != "f" and not np.array_equal(a, b)):
        sys.exit(f"{name}: output {f.stem} differs between the sanitized kernels and the reference")
print(f"  {name}: outputs match")
PY
  done
  echo "== asan: node-test subset through the sanitized CLI (reference interpreter)"
  python3 tests/python/node_conformance.py --cli $b/bindings/nnfuse --per-op 1 --jobs "$(nproc)"
}

run_tsan() {
  local b=build-tsan
  cmake -S . -B $b -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNNFUSE_SANITIZE=thread -DNNFUSE_BUILD_TESTS=ON -DNNFUSE_ARM_SELFTEST=OFF >/dev/null
  ninja -C $b test_lowering
  export NNFUSE_CACHE_DIR=$PWD/$b/kernel-cache NNFUSE_KERNEL_CXXFLAGS="-O1 -fsanitize=thread"
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
  # The thread pool, and every test whose compiled model is run from several threads at once.
  $b/tests/test_lowering "[threads],[concurrency]"
}

for j in "${JOBS_WANTED[@]}"; do
  echo "==== sanitize: $j"
  start=$SECONDS
  case $j in
    asan) (run_asan) ;;
    tsan) (run_tsan) ;;
    fuzz) bash scripts/fuzz.sh --seconds "$FUZZ_SECONDS" ;;
  esac
  echo "==== sanitize: $j took $((SECONDS - start)) s"
done
echo "sanitize: ${JOBS_WANTED[*]} passed"
