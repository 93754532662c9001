#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job on an embedded default: installs what is missing, builds the library and the `maxsim` tool, and
# runs `maxsim demo` (a deterministic synthetic ColBERT-like corpus: packed, searched in exact and certified
# mode, timed, the certified result checked against exact). Extra arguments go to `maxsim demo`
# (e.g. scripts/demo.sh --docs 20000). The build shows its progress; at the end the demo says where the built
# `maxsim` is and how to put it on the PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
echo "demo: configuring $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_BUILD_CLI=ON >/dev/null
echo "demo: building the library and the maxsim tool (a line per step, and every 30 s what is still compiling)"
bash scripts/ninja-progress.sh "$BUILD_DIR" -j"$(nproc)" maxsim_cli
rc=0
"$BUILD_DIR/lib/cli/maxsim" demo "$@" || rc=$?
bin_dir=$(cd "$BUILD_DIR/lib/cli" && pwd)
echo
echo "demo: the maxsim tool is $bin_dir/maxsim; to run it as \`maxsim\`:"
echo "  export PATH=\"$bin_dir:\$PATH\""
echo "or install the library, headers and tool: cmake --build $BUILD_DIR && cmake --install $BUILD_DIR --prefix ~/.local"
exit "$rc"
