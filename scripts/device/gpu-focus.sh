# A focused GPU iteration (device machine): builds the plugin, the GPU suite and the GPU benchmark, runs the GPU
# tests matching GPU_TEST_FILTER (gtest filter, default every test) and the benchmark's GPU_SHAPES (default
# visual q128), without the baselines and profiles of gpu-bench. For development rounds; gpu-tests and gpu-bench
# are the full record.
set -uo pipefail
source scripts/device/env.sh
configure_gpu_build || exit 1
ninja -C "$BUILD" -j"$NPROC" maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-focus.txt"
: > "$S"
export MAXSIM_GPU_TESTS_REQUIRE=1
timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_filter="${GPU_TEST_FILTER:-*}" > "$OUT/gpu-focus-tests.txt" 2>&1
rc=$?
grep -E "MAXSIM_TEST_SEED|^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|tests ran" "$OUT/gpu-focus-tests.txt" >> "$S"
grep -B2 -A12 "Failure" "$OUT/gpu-focus-tests.txt" | head -60 >> "$S"
echo "gpu tests (${GPU_TEST_FILTER:-*}): rc $rc" >> "$S"
for shape in ${GPU_SHAPES:-visual q128}; do
  timeout 120 "$BUILD/benchmarks/gpu/maxsim_gpu_bench" --only "$shape" 2>&1 | grep -E "^$shape |^--" >> "$S"
done
[ $rc -eq 0 ]
