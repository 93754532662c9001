#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (clang-19, ASan + UBSan) and runs each for a share of SECONDS (default 60):
# the packed-buffer validator/loader/scorer (structure-aware: hostile values planted in fields, checksums
# recomputed) and the .npy reader. A crash, sanitizer report or broken contract (a non-finite score from an
# accepted buffer, certified != exact) fails the run and leaves the reproducer in build-fuzz/findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL=${1:-60}
bash scripts/setup.sh --clang
B=build-fuzz
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-19 \
  -DCMAKE_CXX_COMPILER=clang++-19 -DMAXSIM_SANITIZE=address,undefined -DMAXSIM_BUILD_FUZZERS=ON \
  -DMAXSIM_BUILD_TESTS=OFF -DMAXSIM_BUILD_BENCHMARKS=OFF -DMAXSIM_BUILD_CLI=OFF -DMAXSIM_CUDA=OFF >/dev/null
ninja -C $B -j"$(nproc)" maxsim_fuzz_packed maxsim_fuzz_npy maxsim_fuzz_seeds
rm -rf $B/corpus && mkdir -p $B/corpus/packed $B/corpus/npy $B/findings
$B/tests/fuzz/maxsim_fuzz_seeds $B/corpus/packed $B/corpus/npy
packed_s=$(( SECONDS_TOTAL * 2 / 3 )); npy_s=$(( SECONDS_TOTAL - packed_s ))
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
run_fuzzer() {  # name, then the command; any non-zero exit (crash, sanitizer report, abort) fails the run
  local name=$1; shift
  if ! "$@" > "$B/$name.log" 2>&1; then
    tail -n 60 "$B/$name.log"; echo "fuzz.sh: $name failed; reproducer(s) in $B/findings/"; exit 1
  fi
  echo "fuzz.sh: $name: $(grep -E "^#[0-9]+" "$B/$name.log" | tail -n 1)"
}
echo "fuzz.sh: packed buffers for ${packed_s}s, .npy for ${npy_s}s"
run_fuzzer packed $B/tests/fuzz/maxsim_fuzz_packed -max_total_time=$packed_s -max_len=16384 -timeout=10 \
  -artifact_prefix=$B/findings/ $B/corpus/packed
run_fuzzer npy $B/tests/fuzz/maxsim_fuzz_npy -max_total_time=$npy_s -max_len=4096 -timeout=10 \
  -artifact_prefix=$B/findings/ $B/corpus/npy
echo "fuzz.sh: no findings"
