#!/usr/bin/env bash
# The test command (README): installs what is missing, builds, and passes the whole test suite.
#   scripts/test.sh              g++ release build + every test (ctest)
#   scripts/test.sh --sanitize   clang-19 build with AddressSanitizer + UndefinedBehaviorSanitizer
#                                (-fno-sanitize-recover=all: any report fails the run) + every test
# Environment: JOBS (default: number of cores), BUILD_DIR (default build / build-asan).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=release
for arg in "$@"; do
  case "$arg" in
    --sanitize) mode=sanitize ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option '$arg' (known: --sanitize)" >&2; exit 2 ;;
  esac
done
JOBS=${JOBS:-$(nproc)}
if [ "$mode" = sanitize ]; then
  bash scripts/setup.sh --clang
  BUILD_DIR=${BUILD_DIR:-build-asan}
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DMAXSIM_SANITIZE=address,undefined \
    -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON -DMAXSIM_BUILD_BENCHMARKS=OFF -DMAXSIM_CUDA=OFF >/dev/null
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
else
  bash scripts/setup.sh
  BUILD_DIR=${BUILD_DIR:-build}
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON \
    -DMAXSIM_BUILD_BENCHMARKS=ON >/dev/null
fi
echo "test.sh: building ($mode) in $BUILD_DIR with $JOBS jobs"
ninja -C "$BUILD_DIR" -j"$JOBS"
echo "test.sh: running the tests"
ctest --test-dir "$BUILD_DIR" -j"$JOBS" --output-on-failure --timeout 900
