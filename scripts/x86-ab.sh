#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# x86 no-regression A/B: the current tree (B) against the build before the portable-core refactor (A, the commit
# before "Portable kernel core", BASE below), both timed through the public C API by the same benchmark program
# (benchmarks/kernels/kernel_bench: exact and certified, Lq 32, Ld 180 and 300, d 128, 1000 documents, 1 and 2
# threads, every kernel this CPU runs), in interleaved rounds (A B, then B A, ...) so that both see the same
# machine state. Writes a result file (JSON + a Markdown table): per row the median GSO/s of each side and the
# same-round ratio B/A (median, min, max over the rounds), with the command, CPU, date and load averages.
#
# usage: scripts/x86-ab.sh [--rounds N] [--reps N] [--base COMMIT] [--kernels a,b] [--threads 1,2]
#                          [--out benchmarks/results/x86-ab-NAME.json] [--note TEXT]
# Builds A in build-ab/base (from a detached git worktree at build-ab/base-src; `git worktree remove --force
# build-ab/base-src` drops it) and B in build-ab/head, with ccache when present. Needs git, cmake, ninja, a C++
# compiler and the libraries scripts/setup.sh installs. --report-only rewrites the result file from the last
# run's log (build-ab/runs.txt, or --log FILE; it also holds the command and the load average before each run).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=bb59f4d  # CHANGELOG: the docs restructure; the next commit (69c236b) starts the kernels/ reorganisation
ROUNDS=9
REPS=5
KERNELS=""
THREADS=1,2
OUT=""
NOTE=""
REPORT_ONLY=0
LOG_ARG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --report-only) REPORT_ONLY=1; shift ;;
    --log) LOG_ARG=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --kernels) KERNELS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    *) echo "x86-ab: unknown option $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
case "$(uname -m)" in x86_64|amd64) ;; *) echo "x86-ab: x86-64 only (this is $(uname -m))" >&2; exit 2 ;; esac
AB=$ROOT/build-ab
LOG=${LOG_ARG:-$AB/runs.txt}
if [ -z "$OUT" ]; then OUT=$ROOT/benchmarks/results/x86-ab-$(hostname -s).json; fi
if [ "$REPORT_ONLY" = 0 ]; then
mkdir -p "$AB"
LAUNCH=()
if command -v ccache >/dev/null; then LAUNCH=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
build() {  # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=OFF "${LAUNCH[@]}" >"$2.configure.log" 2>&1 ||
    { cat "$2.configure.log" >&2; exit 1; }
  ninja -C "$2" -j2 kernel_bench >"$2.build.log" 2>&1 || { tail -40 "$2.build.log" >&2; exit 1; }
}
BASE_FULL=$(git -C "$ROOT" rev-parse --verify "$BASE^{commit}")
if [ ! -d "$AB/base-src" ]; then git -C "$ROOT" worktree add --detach "$AB/base-src" "$BASE_FULL" >/dev/null; fi
git -C "$AB/base-src" checkout -q --detach "$BASE_FULL"
mkdir -p "$AB/base" "$AB/head"
build "$AB/base-src" "$AB/base"
build "$ROOT" "$AB/head"
A=$AB/base/benchmarks/kernel_bench
B=$AB/head/benchmarks/kernel_bench
if [ -z "$KERNELS" ]; then  # every kernel this CPU runs, as the current build's 'maxsim info' lists them
  ninja -C "$AB/head" -j2 maxsim_cli >>"$AB/head.build.log" 2>&1
  KERNELS=$("$AB/head/lib/cli/maxsim" info --backend cpu 2>/dev/null | awk '/^CPU kernels/ {on=1; next} on && /^  [a-z]/ && ($2 == "selected" || $2 == "available") {print $1} /^Selected kernel/ {on=0}' | paste -sd, -)
fi
args=(--kernels "$KERNELS" --modes exact,certified --threads "$THREADS" --reps "$REPS")
{
  echo "## A base $BASE_FULL"
  echo "## B head $(git -C "$ROOT" describe --always --dirty)"
  echo "## command scripts/x86-ab.sh --rounds $ROUNDS --reps $REPS --base $BASE --kernels $KERNELS --threads $THREADS"
} >"$LOG"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
  for side in $order; do
    bin=$A; [ "$side" = B ] && bin=$B
    echo "# round $r side $side load $(cut -d' ' -f1 /proc/loadavg)" >>"$LOG"
    OPENBLAS_NUM_THREADS=1 "$bin" "${args[@]}" | sed "s/^/$r $side /" >>"$LOG"
  done
  echo "x86-ab: round $r of $ROUNDS done" >&2
done
echo "# after load $(cut -d' ' -f1 /proc/loadavg)" >>"$LOG"
fi
python3 - "$LOG" "$OUT" "$NOTE" <<'EOF'
import json, os, statistics, sys, time
log, out, note = sys.argv[1:4]
rows = {}  # (kernel, mode, dtype, lq, ld, nd, dim, threads) -> {"A": {round: gso}, "B": {...}}
meta, loads = {}, []
for line in open(log):
    f = line.split()
    if line.startswith('## '):
        meta[f[1]] = ' '.join(f[2:])
        continue
    if line.startswith('# '):
        if 'load' in f:
            loads.append(f[f.index('load') + 1])
        continue
    if len(f) < 15 or f[2].startswith('#') or f[2] == 'kernel':
        continue
    rnd, side = int(f[0]), f[1]
    key = tuple(f[2:10])
    try:
        gso = float(f[12])
    except ValueError:
        continue
    rows.setdefault(key, {"A": {}, "B": {}})[side][rnd] = gso
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), 'unknown')
results = []
for key, v in rows.items():
    rounds = sorted(set(v["A"]) & set(v["B"]))
    if not rounds:
        continue
    ratios = [v["B"][r] / v["A"][r] for r in rounds if v["A"][r] > 0]
    results.append({
        "kernel": key[0], "mode": key[1], "dtype": key[2], "Lq": int(key[3]), "Ld": int(key[4]), "Nd": int(key[5]),
        "dim": int(key[6]), "threads": int(key[7]), "rounds": len(rounds),
        "A_median_gso": round(statistics.median(v["A"][r] for r in rounds), 2),
        "B_median_gso": round(statistics.median(v["B"][r] for r in rounds), 2),
        "ratio_B_over_A_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
    })
# Every within-round ratio of every row pooled, per thread count: the overall shift and its spread, and split by
# which side ran first in the round (a machine getting busier or quieter during a round favours one side).
pooled = []
for threads in sorted({r["threads"] for r in results}):
    ratios = {"all": [], "A first": [], "B first": []}
    for key, v in rows.items():
        if int(key[7]) != threads:
            continue
        for rnd in set(v["A"]) & set(v["B"]):
            if v["A"][rnd] > 0:
                x = v["B"][rnd] / v["A"][rnd]
                ratios["all"].append(x)
                ratios["A first" if rnd % 2 == 1 else "B first"].append(x)
    xs = sorted(ratios["all"])
    pooled.append({"threads": threads, "ratios": len(xs), "median": round(statistics.median(xs), 3),
                   "q25": round(xs[len(xs) // 4], 3), "q75": round(xs[(3 * len(xs)) // 4], 3),
                   "median_A_first": round(statistics.median(ratios["A first"]), 3),
                   "median_B_first": round(statistics.median(ratios["B first"]), 3)})
doc = {
    "context": {
        "command": meta.get("command", "?"), "date": time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
        "cpu": cpu, "cpus_online": os.cpu_count(),
        "loadavg_1min_per_run": ' '.join(loads), "A": meta.get("A", "?"), "B": meta.get("B", "?"),
        "benchmark": "benchmarks/kernels/kernel_bench (public C API, packed documents, best of --reps calls per "
                     "round), GSO/s = 2 Lq Ld dim per (query, document) pair per second",
        "note": note,
    },
    "pooled_ratios_B_over_A": pooled,
    "results": results,
}
with open(out, 'w') as fh:
    json.dump(doc, fh, indent=1)
    fh.write('\n')
md = os.path.splitext(out)[0] + '.md'
with open(md, 'w') as fh:
    c = doc["context"]
    fh.write(f"<!-- Generated by scripts/x86-ab.sh from {os.path.basename(out)} -->\n")
    fh.write(f"A = {c['A']}, B = {c['B']}; {c['cpu']}, {c['cpus_online']} CPUs; {c['date']}; 1-minute load "
             f"average before each run and after the last: {c['loadavg_1min_per_run']}.\n`{c['command']}`\n")
    if note:
        fh.write(f"\n{note}\n")
    fh.write("\nEvery within-round ratio B/A pooled over the rows below:\n\n")
    fh.write("| threads | ratios | median | quartiles | median, A ran first | median, B ran first |\n")
    fh.write("|---:|---:|---:|---|---:|---:|\n")
    for p in pooled:
        fh.write(f"| {p['threads']} | {p['ratios']} | {p['median']} | [{p['q25']}, {p['q75']}] | "
                 f"{p['median_A_first']} | {p['median_B_first']} |\n")
    fh.write("\n| kernel | mode | Ld | threads | A GSO/s (median) | B GSO/s (median) | B/A same round: median [min, max] |\n")
    fh.write("|---|---|---:|---:|---:|---:|---|\n")
    for r in sorted(results, key=lambda r: (r["kernel"], r["mode"], r["Ld"], r["threads"])):
        fh.write(f"| {r['kernel']} | {r['mode']} | {r['Ld']} | {r['threads']} | {r['A_median_gso']} | "
                 f"{r['B_median_gso']} | {r['ratio_B_over_A_median']} [{r['ratio_min']}, {r['ratio_max']}] |\n")
print(f"x86-ab: wrote {out} and {md}", file=sys.stderr)
EOF
