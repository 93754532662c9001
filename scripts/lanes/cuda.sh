#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `--cuda`: builds the CUDA plugin (-DMAXSIM_CUDA=ON, for sm_90a only) and runs its CPU-side tests: it
# exports one symbol, needs no CUDA runtime library, loads with this ABI, probes, and without a GPU reports
# itself unavailable with the CPU giving the results (tests that need a GPU skip, saying so; the GPU suite itself
# runs on a machine with an NVIDIA GPU: scripts/device/gpu-tests.sh). Needs nvcc (CUDA toolkit at
# /usr/local/cuda or on PATH). Environment: JOBS, BUILD_DIR (default build-cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build-cuda}
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  echo "cuda: needs the CUDA toolkit (nvcc on PATH, at /usr/local/cuda/bin/nvcc, or CUDACXX)" >&2
  exit 1
fi
# One real architecture, sm_90a: the plugin's tensor-core kernels use Hopper-only instructions (wgmma,
# setmaxnreg) that exist only in the 90a target, so 90a compiles every kernel the plugin has; each further
# architecture is another full nvcc pass over every .cu file, and CI has no GPU to run any of them.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON -DMAXSIM_BUILD_BENCHMARKS=OFF >/dev/null
echo "cuda: building the CUDA plugin and the CPU-side tests in $BUILD_DIR with $JOBS jobs. This is slow: nvcc"
echo "cuda: compiles one instance of the plugin's kernels per dtype, tile shape, dimension chunk and mode, and"
echo "cuda: screen.cu holds most of them. From scratch on a 2-core machine shared with other builds it took 30"
echo "cuda: minutes, screen.cu alone 23 (expect less on an idle one). A line every 30 s says what is compiling."
bash scripts/ninja-progress.sh "$BUILD_DIR" -j"$JOBS" maxsim_plugin_cuda maxsim_tests
echo "cuda: the plugin's CPU-side tests"
"$BUILD_DIR/tests/maxsim_tests" --gtest_filter='CudaPluginHost.*:PluginHost*:PluginAbi*:Plugins/PluginConformance.*'
