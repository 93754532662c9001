# SPDX-License-Identifier: Apache-2.0
# Whether the memory-bound shapes' kernel time is bounded by their schedule (a machine with an NVIDIA GPU):
# maxsim_gpu_bench's kernel rows (MAXSIM_GPU_BENCH_ROWS=kernel) on SCHED_SHAPES (default textual-1k, textual-10k,
# colpali-rerank), SCHED_ROUNDS rounds (default 3), each round one process per side, alternating:
#   default  the plugin as built (the exact row runs the ring or the grid, as CoopChosen picks)
#   ring     MAXSIM_CUDA_NO_COOP=1 (the exact row runs the ring on every shape)
#   dealt    MAXSIM_CUDA_EXPERIMENTAL=dealt-always (one-query shapes the grid does not take run the dealt kernel)
# SCHED_SIDES picks them (default "default ring"); SCHED_SHAPE_ARGS adds gpu_bench --shape arguments (name them in
# SCHED_SHAPES too).
# Each process also times read-same-bytes (the best plain read of the shape's bytes) and the copy-only twins of
# the ring and the grid over the same corpus (read-ring-schedule, read-grid-schedule: benchmarks/gpu/
# schedule_read.cu), and on one-query shapes the schedules no kernel runs (read-cyclic-schedule: the steps dealt
# out round-robin to all warps; read-cyclic-merge-schedule: the same with the merges a kernel on it would need;
# read-balanced-schedule: contiguous ranges of as many steps) and the dealt kernel's (read-dealt-schedule). Printed
# last: per shape and row, ms per round and the mean, and each exact row as a % of each read row (read ms / exact
# ms: the share of that read's rate the kernel reaches).
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-schedule.txt"
gpu_summary_head 'SCHED_[A-Z_]+' gpu-schedule > "$S"
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
shapes=${SCHED_SHAPES:-textual-1k,textual-10k,colpali-rerank}
D="$OUT/schedule"  # this section's per-process files (other sections write bench-*.json too)
mkdir -p "$D"
A="$D/rows.txt"
: > "$A"
t0=$(date +%s)
for r in $(seq "${SCHED_ROUNDS:-3}"); do
  for side in ${SCHED_SIDES:-default ring}; do
    e=()
    [ "$side" = ring ] && e=(MAXSIM_CUDA_NO_COOP=1)
    [ "$side" = dealt ] && e=(MAXSIM_CUDA_EXPERIMENTAL=dealt-always)
    # shellcheck disable=SC2086  # SCHED_SHAPE_ARGS: gpu_bench arguments, e.g. "--shape rerank-100=1,32,100,300"
    env "${e[@]}" MAXSIM_GPU_BENCH_ROWS=kernel timeout 180 "$B" ${SCHED_SHAPE_ARGS:-} --only "$shapes" --json "$D/bench-$side-$r.json" \
      > "$D/bench-$side-$r.txt" 2>&1 || echo "round $r $side: rc $?" >> "$A"
    grep -E " (exact|read-[a-z0-9-]+) " "$D/bench-$side-$r.txt" |
      sed "s|^|round $r $side  |" >> "$A"
  done
  echo "[$(( $(date +%s) - t0 )) s] round $r done" >> "$S"
done
grep -hE "^device" "$D"/bench-*-1.txt | sort -u >> "$S"
{
  echo "== kernel and read rows (ms per round, in order; mean)"
  python3 - "$D" << 'EOF'
import collections, glob, json, os, re, sys
rows = collections.OrderedDict()  # (shape, row) -> [ms]
ran = {}
missed = {}  # (shape, twin) -> the most pairs a twin's launch left unwritten in any process (expected 0)
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*-*.json")),
                   key=lambda p: (int(re.search(r"-(\d+)\.json$", p).group(1)), p)):
    side = re.search(r"bench-(\w+)-\d+\.json$", path).group(1)
    for line in open(path):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        m = o.get("mode")
        if m != "exact" and not m.startswith("read-"):
            continue
        shape = o["shape"]
        if m == "exact":
            m = f"exact-{side}"
        elif side != "default":
            m = f"{m} ({side} process)"
        if "exact_ran" in o:
            ran[(shape, side)] = o["exact_ran"]
        if "pairs_missed" in o:
            missed[(shape, o["mode"])] = max(missed.get((shape, o["mode"]), 0), o["pairs_missed"])
        rows.setdefault((shape, m), []).append(o["ms"])
mean = lambda v: sum(v) / len(v)
shapes = list(dict.fromkeys(k[0] for k in rows))
for shape in shapes:
    kinds = ", ".join(f"exact-{s} ran the {ran[(shape, s)]}" for s in ("default", "ring", "dealt") if (shape, s) in ran)
    print(f"{shape} ({kinds})")
    for (sh, m), v in sorted(rows.items(), key=lambda kv: not kv[0][1].startswith("exact-")):
        if sh == shape:
            print(f"  {m:40s} " + " / ".join(f"{x:.4f}" for x in v) + f"  (mean {mean(v):.4f})")
    print("  pairs the twins left unwritten (expected 0): " +
          ", ".join(f"{m} {v}" for (sh, m), v in missed.items() if sh == shape))
    reads = [m for (sh, m) in rows if sh == shape and m.startswith("read-") and "process)" not in m]
    for ex in (m for (sh, m) in rows if sh == shape and m.startswith("exact-")):
        e = mean(rows[(shape, ex)])
        print(f"  {ex} as % of: " + ", ".join(f"{m} {100 * mean(rows[(shape, m)]) / e:.1f}%" for m in reads))
print("(%: read ms / exact ms, means over rounds; 'default' and 'ring' are the processes: the plugin as built, and"
      " MAXSIM_CUDA_NO_COOP=1; the read rows of the ring processes are listed as a repeat)")
EOF
  grep -E "^round [0-9]+ \S+: rc" "$A" || echo "every gpu_bench process exited 0"
} >> "$S"
# The section's status: non-zero when any gpu_bench process failed (those are listed above).
! grep -qE "^round [0-9]+ \S+: rc" "$A"
