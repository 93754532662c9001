# SPDX-License-Identifier: Apache-2.0
# The serving-batch shapes alone (a machine with an NVIDIA GPU), as gpu-bench records them but in a fraction of
# its time: builds the plugin, the GPU suite and the benchmark; runs the batch kernel's GPU tests (and the other
# wgmma and folded-check tests); times the serving shapes (gpu_bench), the in-run cuBLAS rate (baselines.py) and
# the peers on the same shapes (peers.py, wheels from .whl/); one result file (report.py) like gpu-bench's.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench maxsim || exit 1
S="$OUT/summary-gpu-serve.txt"
: > "$S"
SHAPES="serve-textual-10k-64q serve-colpali-16q"
MAXSIM_GPU_TESTS_REQUIRE=1 timeout 200 "$BUILD/tests/gpu/maxsim_gpu_tests" \
  --gtest_filter='Gpu.QueryBatch*:Gpu.LongQuery*:Gpu.FoldedInput*:Gpu.CandidatesPairsAndTopK' > "$OUT/gpu-serve-tests.txt" 2>&1
trc=$?
grep -E "MAXSIM_TEST_SEED|^\[  (PASSED|FAILED) |^\[       OK" "$OUT/gpu-serve-tests.txt" >> "$S"
grep -B2 -A12 "Failure" "$OUT/gpu-serve-tests.txt" | head -40 >> "$S"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader || true
  grep -m1 "Model name" /proc/cpuinfo 2> /dev/null; nproc; } > "$OUT/gpu-machine.txt" 2>&1
: > "$OUT/gpu-bench.json"
brc=0
for s in $SHAPES; do
  timeout 120 "$BUILD/benchmarks/gpu/maxsim_gpu_bench" --only "$s" --json "$OUT/bench-$s.json" > "$OUT/bench-$s.txt" 2>&1 || brc=1
  cat "$OUT/bench-$s.json" >> "$OUT/gpu-bench.json"
done
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/gpu/baselines.py --json "$OUT/gpu-baselines.json" > "$OUT/gpu-baselines.txt" 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/maxsim-peers .whl/*.whl \
    > "$OUT/peers-install.txt" 2>&1 && export PYTHONPATH=/tmp/maxsim-peers${PYTHONPATH:+:$PYTHONPATH}
fi
LIB=$(ls "$BUILD"/libmaxsim.so 2> /dev/null || ls "$BUILD"/libmaxsim.so.* | head -1)
PYTHONUNBUFFERED=1 timeout 300 python3 benchmarks/gpu/peers.py --lib "$LIB" --json "$OUT/peers.json" --shapes "$SHAPES" \
  > "$OUT/peers.txt" 2>&1
python3 benchmarks/gpu/report.py --bench "$OUT/gpu-bench.json" --baselines "$OUT/gpu-baselines.json" \
  --peers "$OUT/peers.json" --machine "$OUT/gpu-machine.txt" --combine "$OUT/gpu-result-serve.json" \
  --revision "$(cat REVISION 2> /dev/null || git describe --always --dirty 2> /dev/null || echo unknown)" \
  --command "bash scripts/device-run.sh ${DEVICE_RUN_SECTIONS:-gpu-serve}" > "$OUT/gpu-report-serve.md"
{ cat "$OUT"/bench-*.txt | grep -E "^serve"; python3 benchmarks/gpu/report.py --result "$OUT/gpu-result-serve.json" --brief
  echo "tests rc $trc, bench rc $brc"; } >> "$S"
[ $trc -eq 0 ] && [ $brc -eq 0 ]
