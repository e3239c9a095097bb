#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -DNNFUSE_FUZZ=ON: ASan + UBSan + coverage) in build-fuzz/,
# seeds their corpora and runs each for a while. docs/reliability.md has the targets, the long run
# and what a finding becomes.
#
#   bash scripts/fuzz.sh [--seconds N] [--jobs N] [--full-seeds] [TARGET ...]
#
# TARGET: onnx_import model npy rules pipeline artifact (default: all). --seconds per target
# (default 60). --full-seeds uses every ONNX node-test model as a seed (about 1,900; CI takes one
# in eight). Corpora grow in build-fuzz/corpus/<target>; crashes land in build-fuzz/findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache (used when installed, CMakeLists.txt) keys objects on paths relative to the repository
# (base_dir) and ignores the working folder, so a fresh clone in another folder (CI) reuses the
# objects any clone compiled from the same sources.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
SECONDS_PER_TARGET=60
JOBS=1
FULL_SEEDS=0
TARGETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_PER_TARGET=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --full-seeds) FULL_SEEDS=1; shift ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(onnx_import model npy rules pipeline artifact)
BUILD=$(realpath -m "${FUZZ_BUILD_DIR:-build-fuzz}")

if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNNFUSE_FUZZ=ON -DNNFUSE_BUILD_TESTS=ON -DNNFUSE_ARM_SELFTEST=OFF >/dev/null
ninja -C "$BUILD" $(printf 'fuzz_%s ' "${TARGETS[@]}")

corpus=$BUILD/corpus
findings=$BUILD/findings
mkdir -p "$findings"
seed() {  # target, files...
  local d=$corpus/$1
  shift
  mkdir -p "$d"
  for f in "$@"; do cp -n "$f" "$d/$(echo "$f" | md5sum | cut -c1-16)" 2>/dev/null || true; done
}
node_models() {
  local root
  root=$(python3 -c "import sys; sys.path.insert(0, 'tests/python'); import node_conformance as n; print(n.node_test_root())")
  if [[ $FULL_SEEDS == 1 ]]; then ls "$root"/*/model.onnx; else ls "$root"/*/model.onnx | awk 'NR % 8 == 1'; fi
}
for t in "${TARGETS[@]}"; do
  case $t in
    onnx_import|model) mapfile -t seeds < <(node_models; ls tests/data/models/*.onnx) ;;
    rules) mapfile -t seeds < <(ls rules/*.rules; ls tests/fuzz/seeds/rules/* 2>/dev/null) ;;
    pipeline) mapfile -t seeds < <(ls rules/pipelines/*.pipeline) ;;
    npy) mapfile -t seeds < <(ls tests/fuzz/seeds/npy/*) ;;
    artifact) NNFUSE_FUZZ_SEED_DIR=$corpus/artifact "$BUILD/fuzz_artifact" -runs=0 >/dev/null 2>&1; seeds=() ;;
    *) echo "unknown fuzz target '$t'" >&2; exit 2 ;;
  esac
  seed "$t" "${seeds[@]}"
  # The regressions kept from earlier findings are seeds too.
  [[ -d tests/fuzz/regressions/$t ]] && seed "$t" $(ls -d tests/fuzz/regressions/$t/* | grep -v README)
done

status=0
for t in "${TARGETS[@]}"; do
  echo "== fuzz_$t: ${SECONDS_PER_TARGET}s"
  log=$findings/fuzz_$t.log
  # -rss_limit_mb: the library's own caps (fuzz_common.h) must fail first; -timeout: one input.
  # With --jobs N, libFuzzer runs N processes writing fuzz-K.log where it runs: in findings/.
  parallel=()
  [[ $JOBS -gt 1 ]] && parallel=(-jobs="$JOBS" -workers="$JOBS")
  if ! (cd "$findings" && "$BUILD/fuzz_$t" "$corpus/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=20 \
        -rss_limit_mb=3072 -max_len=65536 "${parallel[@]}" -artifact_prefix="$findings/${t}-" -print_final_stats=1) >"$log" 2>&1; then
    status=1
    echo "fuzz_$t FOUND A PROBLEM (inputs in $findings/${t}-*):"
    grep -E "ERROR|SUMMARY|runtime error|terminate|abort|Test unit written" "$log" | head -20 || true
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | sed "s/^/  fuzz_$t /" || true
done
exit $status
