#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `--cuda`: builds the CUDA plugin (-DMAXSIM_CUDA=ON, sm_90a PTX by default) and runs its CPU-side tests: it
# exports one symbol, needs no CUDA runtime library, loads with this ABI, probes, and without a GPU reports
# itself unavailable with the CPU giving the results (tests that need a GPU skip, saying so; the GPU suite itself
# runs on a machine with an NVIDIA GPU: scripts/device/gpu-tests.sh); and the kernel-choice rules, which are host
# functions (tests/cuda_rules_test.cc). Needs nvcc (CUDA toolkit at
# /usr/local/cuda or on PATH). Environment: JOBS, BUILD_DIR (default build-cuda), CUDA_ARCHS (below).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build-cuda}
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  echo "cuda: needs the CUDA toolkit (nvcc on PATH, at /usr/local/cuda/bin/nvcc, or CUDACXX)" >&2
  exit 1
fi
# CUDA_ARCHS (default 90a-virtual): what nvcc generates. The plugin's tensor-core kernels use Hopper-only
# instructions (wgmma, setmaxnreg) that exist only in the 90a target, so 90a covers every kernel. The default,
# 90a-virtual, emits PTX only: every kernel goes through nvcc's front end and code generation, which is what
# proves the sources compile, while ptxas (PTX to machine code, most of the build time: screen.cu's ptxas pass
# alone runs for minutes) is left to the driver or to a real-architecture build (CUDA_ARCHS=90a-real, what
# scripts/device/build.sh does on the GPU machine). CI has no GPU to run either.
CUDA_ARCHS=${CUDA_ARCHS:-90a-virtual}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" \
  -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON -DMAXSIM_BUILD_BENCHMARKS=OFF >/dev/null
echo "cuda: building the CUDA plugin ($CUDA_ARCHS) and the CPU-side tests in $BUILD_DIR with $JOBS jobs. This is"
echo "cuda: slow: nvcc compiles one instance of the plugin's kernels per dtype, tile shape, dimension chunk and mode,"
echo "cuda: most of them in screen.cu. With 90a-virtual (PTX only) it took 8 minutes on a 2-core machine shared with"
echo "cuda: other builds; 90a-real (with ptxas) took 30. A line every 30 s says what is compiling."
bash scripts/ninja-progress.sh "$BUILD_DIR" -j"$JOBS" maxsim_plugin_cuda maxsim_tests maxsim_cuda_rule_tests
echo "cuda: the plugin's CPU-side tests"
"$BUILD_DIR/tests/maxsim_tests" --gtest_filter='CudaPluginHost.*:PluginHost*:PluginAbi*:Plugins/PluginConformance.*'
echo "cuda: the plugin's kernel-choice rules (host functions of its core)"
"$BUILD_DIR/tests/maxsim_cuda_rule_tests"
