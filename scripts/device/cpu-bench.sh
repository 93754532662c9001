# SPDX-License-Identifier: Apache-2.0
# Section of scripts/device-run.sh: the CPU benchmarks on the GPU machine's CPU (Sapphire Rapids-class), with 1, 4
# and 16 threads, every kernel the CPU supports, and the in-run baselines (naive loops, OpenBLAS, oneDNN, FMA
# and int8 peaks). Writes under $OUT:
#   cpu-bench-t<T>.json / .txt   Google Benchmark JSON and console output per thread count
#   cpu-bench.md                 the full markdown tables (scripts/bench-table.py)
#   maxsim-bench.txt, maxsim-demo.txt   the CLI's quick table and its demo (certified == exact check)
#   summary-cpu-bench.txt        a short markdown table (printed by device-run.sh)
# Knobs (environment): CPU_BENCH_THREADS (default "1 4 16"), CPU_BENCH_MIN_TIME (seconds per benchmark,
# default 0.2), CPU_BENCH_FILTER (Google Benchmark filter for 1 thread, default all), CPU_BENCH_FILTER_MT (for
# more threads; default: all but the scalar fallback kernel and the d=64/96 variants, to fit the time budget).
set -uo pipefail
source scripts/device/env.sh
BENCH="$BUILD/benchmarks/cpu_bench"
CLI="$BUILD/lib/cli/maxsim"
if [ ! -x "$BENCH" ]; then
  ninja -C "$BUILD" -j"$NPROC" cpu_bench maxsim_cli || { echo "cpu-bench: cpu_bench did not build" > "$OUT/summary-cpu-bench.txt"; exit 1; }
fi
THREADS=${CPU_BENCH_THREADS:-"1 4 16"}
MIN_TIME=${CPU_BENCH_MIN_TIME:-0.2}
FILTER_1=${CPU_BENCH_FILTER:-.}
FILTER_MT=${CPU_BENCH_FILTER_MT:--(/scalar/|_d64/|_d96/)}
status=0
jsons=()
for t in $THREADS; do
  filter=$FILTER_1
  limit=300
  if [ "$t" != 1 ]; then filter=$FILTER_MT; limit=150; fi
  pin=()
  if command -v taskset > /dev/null && [ "$t" -le "$NPROC" ]; then pin=(taskset -c "0-$((t - 1))"); fi
  echo "cpu-bench: $t thread(s), filter '$filter', min time $MIN_TIME s, ${pin[*]:-unpinned}"
  start=$(date +%s)
  timeout "$limit" "${pin[@]}" "$BENCH" --threads="$t" --benchmark_filter="$filter" --benchmark_min_time="$MIN_TIME" \
    --benchmark_out="$OUT/cpu-bench-t$t.json" --benchmark_out_format=json > "$OUT/cpu-bench-t$t.txt" 2>&1
  rc=$?
  echo "cpu-bench: $t thread(s): rc $rc in $(( $(date +%s) - start )) s"
  [ $rc -ne 0 ] && { status=1; tail -n 5 "$OUT/cpu-bench-t$t.txt"; }
  [ -s "$OUT/cpu-bench-t$t.json" ] && jsons+=("$OUT/cpu-bench-t$t.json")
done
timeout 60 "$CLI" bench --threads 1 --no-progress > "$OUT/maxsim-bench.txt" 2>&1 || status=1
timeout 60 "$CLI" demo --no-progress > "$OUT/maxsim-demo.txt" 2>&1 || status=1
if [ ${#jsons[@]} -gt 0 ]; then
  python3 scripts/bench-table.py "${jsons[@]}" > "$OUT/cpu-bench.md" || status=1
  python3 scripts/bench-table.py --brief "${jsons[@]}" > "$OUT/brief.md" || status=1
fi
{
  echo "CPU benchmarks ($(grep -m1 'Model name' "$OUT/machine.txt" 2>/dev/null | sed 's/.*: *//'); threads: $THREADS; full tables: cpu-bench.md)"
  grep -h "cpu_bench: peak" "$OUT"/cpu-bench-t*.txt 2>/dev/null | sed 's/^cpu_bench: //' | sort -u
  cat "$OUT/brief.md" 2>/dev/null || echo "no benchmark JSON was written"
  grep -h "ERROR OCCURRED" "$OUT"/cpu-bench-t*.txt 2>/dev/null | head -5
  grep -m1 "check certified == exact" "$OUT/maxsim-demo.txt" 2>/dev/null | cut -c1-160 | sed 's/^/demo: /'
} > "$OUT/summary-cpu-bench.txt"
exit $status
