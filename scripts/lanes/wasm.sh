#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `wasm`: the WebAssembly build (clang-19 wasm32-wasi) of both modules, SIMD128 and relaxed SIMD, and their tests under node.
# Installs what it needs (scripts/setup.sh --wasm), builds both modules and the library's C++ tests as
# wasm32-wasi programs (build-wasm, build-wasm-relaxed), runs the C++ tests under node's WASI (kernels, packed
# format, validation, C API, the chain step against a reference, real data when ../shared is there), copies
# the modules beside web/maxsim.mjs and runs the JavaScript API's tests (node --test web/tests/), which compare
# with the native CLI (built in build/) on the shared real embeddings; then the in-browser demo in Debian's
# Chromium, headless, through Playwright (web/tests/browser_test.py; venv in build-web/venv, screenshot and
# results in build-web/artifacts).
# Environment: JOBS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh --wasm
JOBS=${JOBS:-$(nproc)}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
for variant in simd128 relaxed; do
  dir=build-wasm; relaxed=OFF
  [ "$variant" = relaxed ] && { dir=build-wasm-relaxed; relaxed=ON; }
  cmake -S . -B "$dir" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/wasm32-wasi.cmake -DCMAKE_BUILD_TYPE=Release \
    -DMAXSIM_WASM_RELAXED=$relaxed -DMAXSIM_BUILD_TESTS=ON "${launcher[@]}" >/dev/null
  echo "wasm lane: building the $variant module's tests in $dir"
  ninja -C "$dir" -j"$JOBS"
  ctest --test-dir "$dir" --output-on-failure --timeout 900
done
# The native CLI, for the parity tests (web/tests/native.test.mjs): the release lane's build folder, configured
# as that lane does when it is not there yet.
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON \
    -DMAXSIM_BUILD_BENCHMARKS=ON >/dev/null
fi
ninja -C build -j"$JOBS" maxsim_cli
export MAXSIM_CLI=$PWD/build/lib/cli/maxsim
cp build-wasm/web/maxsim-simd128.wasm build-wasm-relaxed/web/maxsim-relaxed.wasm web/
node_flags=(--no-liftoff --experimental-wasm-relaxed-simd --expose-gc)
echo "wasm lane: node --test web/tests/"
node "${node_flags[@]}" --test web/tests/
echo "wasm lane: the demo in headless Chromium"
if [ ! -x build-web/venv/bin/python ] || ! build-web/venv/bin/python -c "import playwright" 2>/dev/null; then
  python3 -m venv build-web/venv
  build-web/venv/bin/pip install -q playwright
fi
build-web/venv/bin/python web/tests/browser_test.py --cli "$MAXSIM_CLI"
