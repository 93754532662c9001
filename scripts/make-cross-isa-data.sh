#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates tests/data/cross-isa/ (packed files + expected score bits) with the native build in BUILD_DIR
# (default build): run it on x86-64 after a deliberate change of the packed format or of the score contract,
# and commit the result. tests/cross_isa_test.cc then checks those files on every ISA (scripts/lanes/arm.sh runs
# it under qemu).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ninja -C "$BUILD_DIR" maxsim_tests
mkdir -p tests/data/cross-isa
MAXSIM_WRITE_CROSS_ISA_DATA=1 "$BUILD_DIR/tests/maxsim_tests" --gtest_filter='CrossIsa.*'
ls -l tests/data/cross-isa
