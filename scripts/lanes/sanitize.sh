#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `--sanitize`: clang-19 build with AddressSanitizer + UndefinedBehaviorSanitizer
# (-fno-sanitize-recover=all: any report fails the run), then every test. Environment: JOBS, BUILD_DIR
# (default build-asan).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh --clang
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build-asan}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DMAXSIM_SANITIZE=address,undefined \
  -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON -DMAXSIM_BUILD_BENCHMARKS=OFF -DMAXSIM_CUDA=OFF >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "test.sh: building (sanitize) in $BUILD_DIR with $JOBS jobs"
ninja -C "$BUILD_DIR" -j"$JOBS"
echo "test.sh: running the tests"
ctest --test-dir "$BUILD_DIR" -j"$JOBS" --output-on-failure --timeout 900
