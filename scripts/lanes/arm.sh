#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `arm`: AArch64 cross build (g++-aarch64-linux-gnu; the `sme` kernel's file with clang-19), tests under
# qemu-aarch64-static at SVE and SME vector lengths 128/256/512/2048.
# Installs the cross toolchain, qemu-user and the arm64 multiarch libraries (scripts/setup.sh --arm), builds the
# library, CLI and tests with cmake/aarch64-linux-gnu.cmake, then runs through qemu (CMAKE_CROSSCOMPILING_EMULATOR;
# the CPU from QEMU_CPU): at 128-bit SVE every test but the multi-GiB, real-data, demo and progress-timing ones (minutes under
# emulation, and not about the ISA); at 256, 512 and 2048 bits the tests whose results depend on the vector
# length of the SVE kernels (sve, sve-i8mm): the cross-ISA bits (every kernel, `sme` included) and the
# cross-kernel agreement (every automatically selectable kernel, every mode, against scalar, candidate sets
# included: query and document lengths around every vector and segment remainder, odd dims, ties, near ties,
# huge/tiny norms, empty documents), and the SVE kernels' approximate-mode reference test (qemu 7.2 runs SVE 5-10x
# slower per instruction above 128 bits, so the other float64-reference tests run at 128 only). The SME
# streaming vector length follows the SVE one in every run: 128 bits for the full suite (qemu 7.2's FMOPA costs
# about 20 us per instruction at its 256-bit default against 0.4 us at 128 bits, which made the `sme` kernel's
# reference tests take minutes), the per-length runs at 256/512/2048; a few tests on a Cortex-A72 (no SVE, no SME)
# show the library loads and runs where the SVE and `sme` kernels cannot. Then
# the edge build (-DMAXSIM_EDGE=ON: static, plugin-free, serial) for aarch64 and its cross-ISA, kernel-reference,
# API and CLI-info tests. Environment: JOBS, BUILD_DIR (default build-arm; the edge build goes to BUILD_DIR-edge).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh --arm
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build-arm}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON -DMAXSIM_BUILD_BENCHMARKS=OFF "${launcher[@]}" >/dev/null
echo "test.sh: building (aarch64 cross) in $BUILD_DIR with $JOBS jobs"
ninja -C "$BUILD_DIR" -j"$JOBS"
# Left out under emulation: the multi-GiB, real-data, demo and long-scoring tests (minutes under qemu), and the
# process-limit test, which execs a helper program as another user: exec from inside qemu-user starts the host
# kernel's loader, which cannot run an AArch64 binary without binfmt_misc.
heavy='RealData|BufferLargerThan4GiB|Cli.DemoPasses|Cli.RealColbert|Api.ProgressCallback|Threads.ThreadCreationFailure'
isa='KernelTest|KernelsAgree|Api\.|CrossIsa'
per_vl='CrossIsa|KernelsAgree\.EveryMode|KernelTest\.Approximate.*/sve'
echo "test.sh: qemu -cpu max, 128-bit SVE and SME: every test but the multi-GiB, real-data and demo ones"
QEMU_CPU=max,sve-default-vector-length=16,sme-default-vector-length=16 ctest --test-dir "$BUILD_DIR" -j"$JOBS" --output-on-failure --timeout 900 -E "$heavy"
for bytes in 32 64 256; do
  echo "test.sh: qemu -cpu max, $((bytes * 8))-bit SVE and SME: cross-ISA bits, cross-kernel agreement, SVE references"
  QEMU_CPU=max,sve-default-vector-length=$bytes,sme-default-vector-length=$bytes ctest --test-dir "$BUILD_DIR" -j"$JOBS" --output-on-failure \
    --timeout 900 -R "$per_vl"
done
echo "test.sh: qemu -cpu cortex-a72 (no SVE, no SME): the library loads and runs without them"
QEMU_CPU=cortex-a72 ctest --test-dir "$BUILD_DIR" -j"$JOBS" --output-on-failure --timeout 900 \
  -R "KernelList|CrossIsa|Cli.InfoBench"

echo "test.sh: edge build (static, plugin-free, OpenMP-free) in $BUILD_DIR-edge"
cmake -S . -B "$BUILD_DIR-edge" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DMAXSIM_EDGE=ON -DMAXSIM_BUILD_TESTS=ON -DMAXSIM_BUILD_CLI=ON "${launcher[@]}" >/dev/null
ninja -C "$BUILD_DIR-edge" -j"$JOBS"
QEMU_CPU=max,sme-default-vector-length=16 ctest --test-dir "$BUILD_DIR-edge" -j"$JOBS" --output-on-failure --timeout 900 \
  -R "CrossIsa|KernelTest.ExactAndCertified|Api\.|Cli.InfoBench" -E "$heavy"
