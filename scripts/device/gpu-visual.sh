# SPDX-License-Identifier: Apache-2.0
# The long-query wgmma kernel alone (a machine with an NVIDIA GPU): its tests, the visual and q128 shapes on a
# packed corpus and from dense device tensors, the in-run cuBLAS rate, and Nsight Compute profiles of the packed
# and the dense visual call. Builds (or unpacks) the plugin, the GPU suite and the benchmark; runs the GPU tests
# matching GPU_TEST_FILTER (default: the long-query, folded-check, non-finite and batch tests); times
# GPU_VISUAL_SHAPES (default visual q128) with MAXSIM_GPU_BENCH_ROWS=dense (rows exact, api-dense,
# dense-kernels), GPU_VISUAL_ROUNDS rounds (default 3; each round starts with the next side), alternating with
# .carry/base-prebuilt.tar.xz (another build's binaries, packed like make-carry's prebuilt archive) when it is
# there, and with each of GPU_VISUAL_VARIANTS (space-separated; each a comma-separated list of VAR=VALUE, read when
# the backend is created; its tests run first, GPU_VISUAL_VARIANT_FILTER; timed on GPU_VISUAL_VARIANT_SHAPES,
# default visual); then the cuBLAS rate (baselines.py --ceilings-only), and with GPU_VISUAL_NCU=1 (the default;
# =packed: the packed call only) a full Nsight Compute profile of one wgmma launch of the packed call and one of
# the dense call (gpu-ncu.sh's report pages), of this build and, with GPU_VISUAL_NCU_BASE=1, of the base build;
# GPU_VISUAL_NCU_VARIANTS (space-separated VAR=VALUE,... lists): the packed call of this build under each as well.
# The SM clock is sampled while the rows run. A table of medians is printed last.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-visual.txt"
: > "$S"
FILTER=${GPU_TEST_FILTER:-'Gpu.LongQuery*:Gpu.FoldedInput*:Gpu.NonFinite*:Gpu.QueryBatch*'}
trc=0
tests() {  # $1: log name; the rest: VAR=VALUE settings
  local log=$OUT/gpu-visual-tests-$1.txt
  shift
  env "$@" MAXSIM_GPU_TESTS_REQUIRE=1 timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_filter="$FILTER" > "$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || trc=$rc
  { echo "tests $(basename "$log") ($*): rc $rc"
    grep -E "^\[  (PASSED|FAILED) |tests ran" "$log"
    grep -B2 -A12 "Failure" "$log" | head -40; } >> "$S"
}
tests new
# Each variant's tests: GPU_VISUAL_VARIANT_FILTER (default the folded-check tests; the long-query test compares
# the kernel's own settings with its default already).
for v in ${GPU_VISUAL_VARIANTS:-}; do
  FILTER=${GPU_VISUAL_VARIANT_FILTER:-'Gpu.FoldedInput*:Gpu.NonFinite*'} tests "${v//[^A-Za-z0-9_]/_}" ${v//,/ }
done
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader || true
  grep -m1 "Model name" /proc/cpuinfo 2> /dev/null; nproc; } > "$OUT/gpu-machine.txt" 2>&1
sides=(new)
if base_build; then
  sides=(base new)
  echo "base: $BASE_REV" >> "$S"
fi
echo "new: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here)" >> "$S"
# One process per (round, shape, side): base and new alternate, so that both see the same clocks.
R="$OUT/gpu-visual-rows.txt"
: > "$R"
brc=0
# The SM clock and board power while the rows run (nvidia-smi every 100 ms; summarised last).
smi=""
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 > "$OUT/clocks.csv" 2> /dev/null &
  smi=$!
fi
for r in $(seq "${GPU_VISUAL_ROUNDS:-3}"); do
  for s in ${GPU_VISUAL_SHAPES:-visual q128}; do
    all=("${sides[@]}")
    # The variants on GPU_VISUAL_VARIANT_SHAPES (default visual) only.
    [[ " ${GPU_VISUAL_VARIANT_SHAPES:-visual} " == *" $s "* ]] && all+=(${GPU_VISUAL_VARIANTS:-})
    # Round r starts with side r - 1 (of n), so that no side always runs first or right after another.
    k=$(( (r - 1) % ${#all[@]} ))
    all=("${all[@]:k}" "${all[@]:0:k}")
    for side in "${all[@]}"; do
      dir=$BUILD; e=()
      [ "$side" = base ] && dir=/tmp/maxsim-base
      [ "$side" != base ] && [ "$side" != new ] && e=(${side//,/ })
      env "${e[@]}" MAXSIM_GPU_BENCH_ROWS=dense LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" MAXSIM_PLUGIN_PATH="$dir" \
        timeout 120 "$dir/benchmarks/gpu/maxsim_gpu_bench" --only "$s" --json "$OUT/rows-$side-$s-$r.json" \
        > "$OUT/rows-$side-$s-$r.txt" 2>&1 || brc=1
      grep -E "^$s +(exact|api-dense|dense-kernels) " "$OUT/rows-$side-$s-$r.txt" | sed "s|^|$r $side |" >> "$R"
    done
  done
done
[ -n "$smi" ] && { kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null; }
PYTHONUNBUFFERED=1 timeout 120 python3 benchmarks/gpu/baselines.py --ceilings-only --json "$OUT/gpu-baselines.json" \
  > "$OUT/gpu-baselines.txt" 2>&1
# Nsight Compute: the packed call's 4th wgmma launch, and a dense call's (the 39th: the exact row's 35 launches, 5
# warm-up + 30 timed by gpu_bench's TimeIt, come first; the dense rows' calls, which start with 50 ms of the same
# call to bring the clocks up, come next).
ncu_one() {  # $1: side, $2: build dir, $3: what, $4: launches skipped
  local rep=$OUT/ncu-$1-$3
  command -v ncu > /dev/null || { echo "ncu not found" >> "$S"; return; }
  MAXSIM_GPU_BENCH_ROWS=dense LD_LIBRARY_PATH="$2:$LD_LIBRARY_PATH" MAXSIM_PLUGIN_PATH="$2" timeout 300 \
    ncu --clock-control none --set full --import-source no -k "regex:ExactWgmma" --launch-skip "$4" --launch-count 1 \
    -f -o "$rep" "$2/benchmarks/gpu/maxsim_gpu_bench" --only visual > "$rep.log" 2>&1
  echo "ncu $1 $3: rc $?" >> "$S"
  ncu --import "$rep.ncu-rep" --page details > "$rep-details.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep-sass.csv" 2>&1
  ncu --import "$rep.ncu-rep" --page raw --csv > "$rep-raw.csv" 2>&1
  grep -E "Duration|SM Frequency|Registers Per|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|L2 Hit|Executed Ipc A" \
    "$rep-details.txt" | head -12 | sed "s|^|  |" >> "$S"
  # Headline counters from the raw page: the tensor pipe, issue, shared-memory conflicts, and the stall reasons
  # (warp-state samples) largest first.
  python3 - "$rep-raw.csv" >> "$S" <<'PY'
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if "gpu__time_duration.sum" in r), None)
if hdr is None or len(rows) < hdr + 3:
    print("  raw page unreadable"); sys.exit(0)
names, vals = rows[hdr], rows[hdr + 2]
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return None
m = {n: num(v) for n, v in zip(names, vals)}
want = [r"gmma.*pct_of_peak", r"pipe_tensor.*pct_of_peak", r"^smsp__issue_active\.avg\.pct", r"^sm__throughput\.avg\.pct",
        r"bank_conflicts.*shared.*sum$", r"^launch__registers_per_thread$", r"^smsp__warps_eligible\.avg\.per_cycle_active$",
        r"^sm__cycles_active\.avg$", r"^gpc__cycles_elapsed\.max$", r"^dram__bytes_read\.sum$", r"^smsp__inst_executed\.sum$",
        r"^gpu__time_duration\.sum$"]
for w in want:
    for n in names:
        if re.search(w, n) and m.get(n) is not None:
            print(f"  {n} = {m[n]:.4g}")
st = sorted(((v, n) for n, v in m.items() if v and re.match(r"smsp__pcsamp_warps_issue_stalled_\w+$", n)
             and not n.endswith("_not_issued")), reverse=True)
tot = sum(v for v, _ in st) or 1
print("  stall samples: " + ", ".join(f"{n.replace('smsp__pcsamp_warps_issue_stalled_', '')} {100 * v / tot:.0f}%" for v, n in st[:8]))
PY
  rm -f "$rep.ncu-rep"
}
if [ "${GPU_VISUAL_NCU:-1}" != 0 ]; then
  ncu_one new "$BUILD" packed 3
  for v in ${GPU_VISUAL_NCU_VARIANTS:-}; do
    (export ${v//,/ }; ncu_one "${v//[^A-Za-z0-9_]/_}" "$BUILD" packed 3)
  done
  [ "${GPU_VISUAL_NCU:-1}" != packed ] && ncu_one new "$BUILD" dense 38
  if [ "${GPU_VISUAL_NCU_BASE:-0}" != 0 ] && [ -d /tmp/maxsim-base ]; then
    ncu_one base /tmp/maxsim-base dense 38
  fi
fi
{
  echo "rows (ms; round side shape row ms ...):"
  cat "$R"
  python3 - "$R" "$OUT/gpu-baselines.json" <<'PY'
import collections, json, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5:
        t[(f[2], f[3], f[1])].append(float(f[4]))
gemm = None
try:
    for line in open(sys.argv[2]):
        o = json.loads(line)
        if o.get("baseline") == "cublas_bf16":
            gemm = o["tflops"]
except OSError:
    pass
flops = {"visual": 2.0 * 1024 * 1024 * 128 * 1000, "q128": 2.0 * 128 * 1030 * 128 * 1000}
print(f"cuBLAS bf16 {gemm:.0f} TFLOP/s" if gemm else "cuBLAS rate missing")
print(f"{'shape':8} {'row':14} {'side':40} {'median ms':>9} {'%cuBLAS':>8}  runs")
for (shape, row, side), v in sorted(t.items()):
    m = statistics.median(v)
    pct = f"{100 * flops[shape] / (m * 1e-3) / (gemm * 1e12):7.1f}%" if gemm and shape in flops else "       -"
    print(f"{shape:8} {row:14} {side[:40]:40} {m:9.4f} {pct}  {' '.join(f'{x:.4f}' for x in v)}")
PY
  python3 -c '
import statistics, sys
rows = [[float(x) for x in l.split(",")] for l in open(sys.argv[1]) if l.count(",") == 1 and l[0].isdigit()]
busy = [r for r in rows if r[1] > 150]
if busy:
    print(f"SM clock while busy: median {statistics.median(r[0] for r in busy):.0f} MHz, min {min(r[0] for r in busy):.0f}"
          f" ({len(busy)} samples), mean power {statistics.mean(r[1] for r in busy):.0f} W")' "$OUT/clocks.csv" 2> /dev/null
  echo "tests rc $trc, bench rc $brc"
} >> "$S"
[ $trc -eq 0 ] && [ $brc -eq 0 ]
