# SPDX-License-Identifier: Apache-2.0
# A focused GPU iteration (a machine with an NVIDIA GPU): builds the plugin, the GPU suite and the GPU benchmark, runs the GPU
# tests matching GPU_TEST_FILTER (gtest filter, default every test) and the benchmark's GPU_SHAPES (default
# visual q128), without the baselines and profiles of gpu-bench. For quick iterations; gpu-tests and gpu-bench
# are the full record.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-focus.txt"
: > "$S"
export MAXSIM_GPU_TESTS_REQUIRE=1
timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_filter="${GPU_TEST_FILTER:-*}" > "$OUT/gpu-focus-tests.txt" 2>&1
rc=$?
grep -E "MAXSIM_TEST_SEED|^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|tests ran" "$OUT/gpu-focus-tests.txt" >> "$S"
grep -B2 -A12 "Failure" "$OUT/gpu-focus-tests.txt" | head -60 >> "$S"
echo "gpu tests (${GPU_TEST_FILTER:-*}): rc $rc" >> "$S"
# The SM clock and board power while each shape runs (nvidia-smi every 50 ms): a kernel's time under sustained
# load includes the clock the board holds at its power limit, which a profiler's isolated replay does not see.
for shape in ${GPU_SHAPES:-visual q128}; do
  smi=""
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 50 \
      > "$OUT/clocks-$shape.csv" 2> /dev/null &
    smi=$!
  fi
  timeout 120 "$BUILD/benchmarks/gpu/maxsim_gpu_bench" --only "$shape" 2>&1 | grep -E "^$shape |^--" >> "$S"
  if [ -n "$smi" ]; then
    kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null
    python3 - "$OUT/clocks-$shape.csv" >> "$S" <<'EOF'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try: rows.append([float(x) for x in line.split(",")])
    except ValueError: pass
busy = [r for r in rows if r[1] > 150]  # samples while the GPU drew more than idle power
if busy:
    c = sorted(r[0] for r in busy); p = sorted(r[1] for r in busy)
    print(f"  clocks while busy ({len(busy)} of {len(rows)} samples): SM MHz min {c[0]:.0f} median "
          f"{statistics.median(c):.0f} max {c[-1]:.0f}; power W median {statistics.median(p):.0f} max {p[-1]:.0f}; "
          f"temperature max {max(r[2] for r in busy):.0f} C")
EOF
  fi
done
[ $rc -eq 0 ]
