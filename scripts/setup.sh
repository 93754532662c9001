#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what libmaxsim needs to build and test on Debian 12 (bookworm). Idempotent: when everything is
# present it only asks dpkg and exits in well under a second.
#   scripts/setup.sh            core build + tests (g++, Highway, oneDNN, OpenMP, GoogleTest, Benchmark, OpenBLAS;
#                               ccache, so that the test lanes' several build folders compile each source once)
#   scripts/setup.sh --clang    also clang-19 (sanitizer build, libFuzzer, AVX-512/AMX intrinsics)
#   scripts/setup.sh --wasm     also the WebAssembly toolchain (clang-19, wasi-libc, wasm32 libc++), node and
#                               Chromium (the browser test; Playwright comes from PyPI into build-web/venv)
#   scripts/setup.sh --python   also the Python headers and venv module (pip install . of the Python package)
#   scripts/setup.sh --arm      also the AArch64 cross toolchain, qemu-user and the arm64 multiarch libraries
#                               (and clang-19 with compiler-rt's arm64 builtins for the `sme` kernel)
set -euo pipefail

arm=0
want=(cmake ninja-build ccache g++ libhwy-dev libdnnl-dev libgtest-dev libbenchmark-dev libopenblas-dev python3)
for arg in "$@"; do
  case "$arg" in
    --clang) want+=(clang-19 lld-19 libomp-19-dev libclang-rt-19-dev) ;;
    --wasm) want+=(clang-19 lld-19 wasi-libc libc++-19-dev-wasm32 libc++abi-19-dev-wasm32 libclang-rt-19-dev-wasm32
                   nodejs chromium python3-venv) ;;
    --python) want+=(python3-dev python3-venv python3-pip) ;;
    --arm) arm=1
           # clang-19 + compiler-rt's arm64 builtins: the explicit-only `sme` kernel (cmake/sme.cmake)
           want+=(g++-aarch64-linux-gnu qemu-user-static libhwy-dev:arm64 libgtest-dev:arm64 libgomp1:arm64
                  clang-19 libclang-rt-19-dev:arm64) ;;
    *) echo "setup.sh: unknown option '$arg' (known: --clang, --wasm, --python, --arm)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup.sh: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
if [ "$arm" = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64  # the arm64 multiarch libraries (Highway, GoogleTest, libgomp)
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
echo "setup.sh: done"
