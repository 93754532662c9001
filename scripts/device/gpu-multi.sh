# SPDX-License-Identifier: Apache-2.0
# Several GPUs (a machine with two or more NVIDIA GPUs; with one, device 0 is listed twice): the whole GPU suite
# with every context that names no devices sharded over all the GPUs (MAXSIM_CUDA_DEVICES=0,1,...;
# GPU_MULTI_TEST_FILTER narrows it), and the scaling benchmark through the public C API
# (benchmarks/gpu/multi_gpu_bench.cc: textual-10k x 8 = 80000 documents of 300 tokens, one query and a 64-query
# batch, top-10 and the score matrix; one device against the corpus sharded over all of them, with the results
# compared bit for bit, and one device on the first half of the corpus, which bounds the speed-up two devices can
# give; --staged runs the sharded list again with each shard's score matrix staged by the host,
# MAXSIM_CUDA_MATRIX_COLUMNS=0, against each shard writing its columns of the caller's matrix itself). Writes
# $OUT/multi-gpu.json (one JSON object per row, with the command, the GPUs and the date), multi-gpu.txt and
# summary-gpu-multi.txt.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_multi_gpu_bench || exit 1
S="$OUT/summary-gpu-multi.txt"
n=$(nvidia-smi -L 2> /dev/null | grep -c "^GPU")
all=$(seq -s, 0 $((n - 1)))
[ "$n" -ge 2 ] || all="0,0"
{ echo "GPUs: $n; sharded list: $all"; nvidia-smi -L 2> /dev/null; } > "$S"
MAXSIM_GPU_TESTS_REQUIRE=1 MAXSIM_CUDA_DEVICES=$all timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" \
  --gtest_filter="${GPU_MULTI_TEST_FILTER:-*}" \
  > "$OUT/gpu-multi-tests.txt" 2>&1
trc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/gpu-multi-tests.txt" >> "$S"
grep -B2 -A12 "Failure" "$OUT/gpu-multi-tests.txt" | head -40 >> "$S"
echo "GPU tests with MAXSIM_CUDA_DEVICES=$all: rc $trc" >> "$S"
timeout 400 "$BUILD/benchmarks/gpu/maxsim_multi_gpu_bench" --devices "0;$all" --staged --json "$OUT/multi-gpu.json" \
  > "$OUT/multi-gpu.txt" 2>&1
brc=$?
cat "$OUT/multi-gpu.txt" >> "$S"
echo "multi_gpu_bench: rc $brc" >> "$S"
[ $trc -eq 0 ] && [ $brc -eq 0 ]
