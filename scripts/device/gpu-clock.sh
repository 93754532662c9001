# SPDX-License-Identifier: Apache-2.0
# The SM clock the GPU grants the memory-bound kernels and their copy-only twins (a machine with an NVIDIA GPU),
# measured two ways in one call:
#  1. nvidia-smi samples every CLOCK_SAMPLE_MS (default 20) ms the SM clock, the power drawn and the clock-event
#     reasons, while maxsim_gpu_bench's kernel rows (MAXSIM_GPU_BENCH_ROWS=kernel: exact, read-same-bytes and the
#     twins of benchmarks/gpu/schedule_read.cu) of each shape of CLOCK_SHAPES ("SHAPE:CALLS ...", default
#     textual-1k:10000 colpali-rerank:4000 textual-100:30000) run CALLS calls each (MAXSIM_GPU_BENCH_ITERS); the
#     rows' lines are time-stamped as they end and benchmarks/gpu/clock_report.py gives each row the samples
#     taken while it ran;
#  2. Nsight Compute (gpu-ncu.sh's default mode, --clock-control none) on one launch of each kernel of CLOCK_NCU
#     ("SHAPE:KERNEL-REGEX ..."), the profiles side by side (ncu_compare.py: the SM, DRAM and L2 clocks, elapsed
#     and per-SM active cycles, traffic, stalls, SASS opcodes).
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_bench maxsim || exit 1
S="$OUT/summary-gpu-clock.txt"
gpu_summary_head 'CLOCK_[A-Z_]+|NCU_NAME_BASE' gpu-clock > "$S"
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
D="$OUT/clock"
mkdir -p "$D"
# power.draw.instant where the driver has it (power.draw is averaged over a second).
fields=timestamp,clocks.sm,clocks.mem,power.draw.instant,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$fields --format=csv > /dev/null 2>&1 || fields=${fields/power.draw.instant,/}
nvidia-smi --query-gpu=$fields --format=csv,nounits -lms "${CLOCK_SAMPLE_MS:-20}" > "$D/smi.csv" 2> "$D/smi.err" &
smi=$!
sleep 1
set -f  # the lists below are split on spaces, never globbed (CLOCK_NCU holds regular expressions)
rows=()
for e in ${CLOCK_SHAPES:-textual-1k:10000 colpali-rerank:4000 textual-100:30000}; do
  shape=${e%%:*} calls=${e#*:}
  if ! [[ "$e" == *:* && "$calls" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu-clock: CLOCK_SHAPES entry '$e' is not SHAPE:CALLS (CALLS a positive count); skipped" >> "$S"
    continue
  fi
  echo "# calls $calls" > "$D/rows-$shape.txt"
  rows+=("$D/rows-$shape.txt")
  MAXSIM_GPU_BENCH_ITERS=$calls MAXSIM_GPU_BENCH_ROWS=kernel timeout 300 "$B" --only "$shape" 2>&1 |
    while IFS= read -r l; do echo "$(date +%Y/%m/%d\ %H:%M:%S.%3N) $l"; done >> "$D/rows-$shape.txt"
  echo "gpu_bench $shape, $calls calls per row: rc ${PIPESTATUS[0]}" >> "$S"
  sleep 1
done
kill "$smi" 2> /dev/null
wait "$smi" 2> /dev/null
if [ ${#rows[@]} -gt 0 ]; then
  python3 benchmarks/gpu/clock_report.py "$D/smi.csv" "${rows[@]}" > "$D/clock.txt" 2>&1
  cat "$D/clock.txt" >> "$S"
fi
profiles=()
for e in ${CLOCK_NCU:-}; do
  shape=${e%%:*} kernel=${e#*:}
  if [[ "$e" != *:* || -z "$kernel" ]]; then
    echo "gpu-clock: CLOCK_NCU entry '$e' is not SHAPE:KERNEL-REGEX; skipped" >> "$S"
    continue
  fi
  R="$D/ncu-$shape-$(echo "$kernel" | tr -c 'A-Za-z0-9\n' _)"
  mkdir -p "$R"
  OUT=$R MAXSIM_GPU_BENCH_ROWS=kernel NCU_SHAPE=$shape NCU_KERNEL=$kernel NCU_SKIP=${NCU_SKIP:-5} \
    timeout 200 bash scripts/device/gpu-ncu.sh > "$R/log" 2>&1
  echo "ncu $shape /$kernel/: rc $?" >> "$S"
  [ -f "$R/ncu-$shape-raw.csv" ] && profiles+=("$shape:$kernel=$R/ncu-$shape-raw.csv,$R/ncu-$shape-sass.csv")
done
set +f
# The profiles side by side: clocks, cycles, SM activity, traffic, stalls and SASS opcodes.
[ ${#profiles[@]} -gt 0 ] && python3 benchmarks/gpu/ncu_compare.py --json "$D/ncu-compare.json" "${profiles[@]}" >> "$S"
