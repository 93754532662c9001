#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job on an embedded default: installs what is missing, builds the library and the `maxsim` tool, and
# runs `maxsim demo` (a deterministic synthetic ColBERT-like corpus: packed, searched in exact and certified
# mode, timed, the certified result checked against exact). Extra arguments go to `maxsim demo`
# (e.g. scripts/demo.sh --docs 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_BUILD_CLI=ON >/dev/null
ninja -C "$BUILD_DIR" -j"$(nproc)" maxsim_cli >/dev/null
exec "$BUILD_DIR/lib/cli/maxsim" demo "$@"
