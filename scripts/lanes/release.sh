#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `release` (scripts/test.sh with no option): g++ release build of the library, CLI, tests and benchmarks,
# then every test through CTest. Environment: JOBS, BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON \
  -DMAXSIM_BUILD_BENCHMARKS=ON >/dev/null
echo "test.sh: building (release) in $BUILD_DIR with $JOBS jobs"
bash scripts/ninja-progress.sh "$BUILD_DIR" -j"$JOBS"
echo "test.sh: running the tests"
ctest --test-dir "$BUILD_DIR" -j"$JOBS" --output-on-failure --timeout 900
