# SPDX-License-Identifier: Apache-2.0
# GPU conformance (a machine with an NVIDIA GPU): builds only what it needs (so that unrelated work in progress cannot stop
# it), runs the GPU suite against the CPU float64 reference and the CPU backward, compute-sanitizer memcheck on
# a small case of every operation and racecheck and synccheck on the ring's one-query launches, the dealt
# kernel and the grid, `maxsim info` (the plugin and backend lines) and the demo on the GPU.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_cli || exit 1
S="$OUT/summary-gpu-tests.txt"
: > "$S"
"$BUILD/lib/cli/maxsim" info > "$OUT/maxsim-info-gpu.txt" 2>&1
grep -E "^  cuda|available:|unavailable:|^Backend" "$OUT/maxsim-info-gpu.txt" >> "$S"
export MAXSIM_GPU_TESTS_REQUIRE=1
t0=$(date +%s)
timeout 180 "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_output=xml:"$OUT/gpu-tests.xml" > "$OUT/gpu-tests.txt" 2>&1
rc=$?
grep -E "MAXSIM_TEST_SEED|refined|^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/gpu-tests.txt" >> "$S"
grep -B2 -A12 "Failure" "$OUT/gpu-tests.txt" | head -60 >> "$S"
echo "gpu conformance: rc $rc ($(( $(date +%s) - t0 )) s)" >> "$S"
# compute-sanitizer after the suite, its runs side by side: memcheck on a small case of every operation; racecheck
# and synccheck on the ring kernel's block-shared query (one cp.async group, one barrier), the dealt kernel's shared
# row maxima (8 slots per round of documents, two barriers per round) and the grid's (its warps' rows merged by
# warp 0 after one barrier; CoopAlwaysBelowTheRule forces it on ragged documents): races and barrier misuse, which
# the suite's bits catch only by chance. One process per tool and test, so that the slowest (racecheck on the dealt
# kernel, one to two minutes) sets the time: 122-130 s on the H200, where one after another they take about as
# long as the GPU benchmark. The suite itself runs alone, because beside long instrumented launches its thousands of
# short ones wait for time slices. The timeouts (180 s for the suite, 200 s for the sanitizers: 1.5-2x what they
# take) bound the section at under 8 minutes when something hangs.
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t1=$(date +%s)
declare -A san_pid
timeout 200 "$SAN" --tool memcheck --error-exitcode 9 --leak-check full \
  "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_filter='Gpu.SanitizeSmallEveryOperation' > "$OUT/sanitizer.txt" 2>&1 &
san_pid[memcheck]=$!
san_tests=(Gpu.OneQueryRingLaunchesShareTheQuery Gpu.DealtKernelMatchesTheRing Gpu.CoopAlwaysBelowTheRule)
for tool in racecheck synccheck; do
  for t in "${san_tests[@]}"; do
    timeout 200 "$SAN" --tool $tool --error-exitcode 9 "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_filter="$t" \
      > "$OUT/sanitizer-$tool-${t#Gpu.}.txt" 2>&1 &
    san_pid[$tool-${t#Gpu.}]=$!
  done
done
wait "${san_pid[memcheck]}"
src=$?
{ echo "compute-sanitizer memcheck (small case of every operation): rc $src"; tail -n 3 "$OUT/sanitizer.txt"; } >> "$S"
for tool in racecheck synccheck; do
  for t in "${san_tests[@]}"; do
    wait "${san_pid[$tool-${t#Gpu.}]}"
    r=$?
    f="$OUT/sanitizer-$tool-${t#Gpu.}.txt"
    echo "compute-sanitizer $tool $t: rc $r; $(grep -E '^\[       OK|^\[  (PASSED|FAILED|SKIPPED) ' "$f" | tail -n 1 | tr -s ' ');" \
      "$(grep -E 'SUMMARY' "$f" | tail -n 1)" >> "$S"
    [ $r -eq 0 ] || src=$r
  done
done
echo "compute-sanitizer, side by side: $(( $(date +%s) - t1 )) s" >> "$S"
MAXSIM_BACKEND=cuda timeout 60 "$BUILD/lib/cli/maxsim" demo > "$OUT/demo-gpu.txt" 2>&1
drc=$?
{ echo "maxsim demo with MAXSIM_BACKEND=cuda: rc $drc"; tail -n 6 "$OUT/demo-gpu.txt"; } >> "$S"
[ $rc -eq 0 ] && [ $src -eq 0 ] && [ $drc -eq 0 ]
