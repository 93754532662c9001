# SPDX-License-Identifier: Apache-2.0
# The one-block-per-pair grid's selection rule at its boundaries (a machine with an NVIDIA GPU). CoopChosen
# (plugins/cuda/src/exact_coop.cu) gives the ring's dot calls to the grid from 48 pairs per SM, or where each
# document is scored once and the documents hold 512+ tokens on average; this times the ring and the grid on both
# sides of those lines. maxsim_gpu_bench's kernel rows (MAXSIM_GPU_BENCH_ROWS=kernel) on one-query bf16 shapes added
# with --shape (RULE_SHAPES, NAME=nq,lq,nd,ld[,dim] separated by spaces, replaces the list):
#   l256 ... l768  a 32-row query over 1000 documents of 256, 384, 448, 512, 576, 640 and 768 tokens
#   n2000 ... n8000  a 32-row query over 2000, 4000, 6336 (48 per SM on 132 SMs) and 8000 documents of 300 tokens
#   q16l1030, q16n10000  a 16-row query over colpali-rerank's (1000 x 1030) and textual-10k's (10000 x 300) documents
#   n600l1030  a 32-row query over 600 documents of 1030 tokens: 1.5 waves of the grid's blocks on 132 SMs
#   d64  dim 64, a 32-row query over 1000 documents of 1030 tokens
# RULE_ROUNDS rounds (default 2), each one process per side, alternating (RULE_SIDES, default all three):
#   rule  the plugin as built (the exact row runs the ring or the grid, as CoopChosen picks)
#   ring  MAXSIM_CUDA_NO_COOP=1
#   grid  MAXSIM_CUDA_EXPERIMENTAL=coop-always (the grid wherever CoopChosen is asked)
# gpu_bench has no kernel row that asks for the argmax, so every row here is values only.
# Printed last, per shape: pairs per SM and tokens per document, the exact row's ms per side (mean over rounds)
# and the spread of its rounds, the kernel each side's exact row ran (gpu_bench's exact_ran), the faster of ring and
# grid and by how much, and RULE-LOSES where the rule picked the slower one by more than 1%. The section fails only
# when a gpu_bench process failed.
# Wall time: about 1.5-2.5 minutes, an estimate, not a measurement: 6 gpu_bench processes of 16 shapes at 12-25 s
# each (3.5 times the tokens of gpu-schedule's 3-shape process, which took about 4.5 s on an H100).
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-coop-rule.txt"
gpu_summary_head 'RULE_[A-Z_]+' gpu-coop-rule > "$S"
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
specs=${RULE_SHAPES:-l256=1,32,1000,256 l384=1,32,1000,384 l448=1,32,1000,448 l512=1,32,1000,512 \
l576=1,32,1000,576 l640=1,32,1000,640 l768=1,32,1000,768 n2000=1,32,2000,300 n4000=1,32,4000,300 \
n6336=1,32,6336,300 n8000=1,32,8000,300 q16l1030=1,16,1000,1030 q16n10000=1,16,10000,300 n600l1030=1,32,600,1030 \
d64=1,32,1000,1030,64}
args=()
names=()
for sp in $specs; do
  args+=(--shape "$sp")
  names+=("${sp%%=*}")
done
only=$(IFS=,; echo "${names[*]}")
D="$OUT/coop-rule"  # this section's per-process files (other sections write bench-*.json too)
mkdir -p "$D"
A="$D/rows.txt"
: > "$A"
t0=$(date +%s)
for r in $(seq "${RULE_ROUNDS:-2}"); do
  for side in ${RULE_SIDES:-rule ring grid}; do
    e=()
    [ "$side" = ring ] && e=(MAXSIM_CUDA_NO_COOP=1)
    [ "$side" = grid ] && e=(MAXSIM_CUDA_EXPERIMENTAL=coop-always)
    env "${e[@]}" MAXSIM_GPU_BENCH_ROWS=kernel timeout 240 "$B" "${args[@]}" --only "$only" \
      --json "$D/bench-$side-$r.json" > "$D/bench-$side-$r.txt" 2>&1 || echo "round $r $side: rc $?" >> "$A"
    grep -E " (exact|read-ring-schedule) " "$D/bench-$side-$r.txt" | sed "s|^|round $r $side  |" >> "$A"
  done
  echo "[$(( $(date +%s) - t0 )) s] round $r done" >> "$S"
done
grep -hE "^device:" "$D"/bench-*-1.txt | sort -u >> "$S"
{
  echo "== the exact row per side (ms, mean over rounds), and the kernel the rule picked"
  python3 - "$D" "$specs" << 'EOF'
import glob, json, os, re, sys
out, specs = sys.argv[1], sys.argv[2].split()
shape = {}  # name -> (nq, lq, nd, ld, dim)
for sp in specs:
    name, nums = sp.split("=", 1)
    v = [int(x) for x in nums.split(",")]
    shape[name] = tuple(v[:4]) + (v[4] if len(v) > 4 else 128,)
ms = {}   # (shape, side) -> [ms per round]
ran = {}  # (shape, side) -> set of kernels the exact row ran
sms = set()
for path in sorted(glob.glob(os.path.join(out, "bench-*-*.txt"))):
    for line in open(path):
        m = re.match(r"device: .*, (\d+) SMs", line)
        if m:
            sms.add(int(m.group(1)))
def json_rows(path):  # a line cut short by a killed process is passed over
    for line in open(path):
        try:
            yield json.loads(line)
        except ValueError:
            pass
for path in glob.glob(os.path.join(out, "bench-*-*.json")):  # rounds in any order: means and spreads only
    side = re.search(r"bench-(\w+)-\d+\.json$", path).group(1)
    for o in json_rows(path):
        if o.get("shape") not in shape:
            continue
        if o.get("mode") == "exact":
            ms.setdefault((o["shape"], side), []).append(o["ms"])
        if "exact_ran" in o:
            ran.setdefault((o["shape"], side), set()).add(o["exact_ran"])
sm = max(sms) if sms else 0
if len(sms) > 1:
    print(f"(!) the processes saw different SM counts: {sorted(sms)}; pairs per SM below use {sm}")
mean = lambda v: sum(v) / len(v)
sides = ("rule", "ring", "grid")
print(f"{'shape':10s} {'nq,lq,nd,ld,dim':22s} {'pairs/SM':>8s} " + " ".join(f"{s + ' ms':>8s}" for s in sides) +
      f" {'spread':>6s}  {'rule ran':8s} {'faster':6s} {'by':>6s}")
losses, notes, uncompared = [], [], []
for name in shape:
    nq, lq, nd, ld, dim = shape[name]
    mean_ms = {s: mean(ms[(name, s)]) for s in sides if ms.get((name, s))}
    spread = max((100 * (max(ms[(name, s)]) - min(ms[(name, s)])) / mean_ms[s] for s in mean_ms), default=0)
    picked = "/".join(sorted(ran.get((name, "rule"), {"?"})))
    for s in ("ring", "grid"):
        got = ran.get((name, s))
        if got is not None and got != {s}:
            notes.append(f"(!) {name}: the {s} side's exact row ran the {'/'.join(sorted(got))}")
    faster, by, flag = "?", "", ""
    if "ring" in mean_ms and "grid" in mean_ms:
        fast, slow = sorted(("ring", "grid"), key=lambda s: mean_ms[s])
        faster, gain = fast, 100 * (mean_ms[slow] / mean_ms[fast] - 1)
        by = f"{gain:.1f}%"
        if picked == slow and gain > 1:
            flag = "RULE-LOSES"
            losses.append(name)
    else:
        uncompared.append(name)
    cells = " ".join(f"{mean_ms[s]:8.4f}" if s in mean_ms else f"{'-':>8s}" for s in sides)
    per_sm = f"{nq * nd / sm:8.1f}" if sm else f"{'?':>8s}"
    print(f"{name:10s} {f'{nq},{lq},{nd},{ld},{dim}':22s} {per_sm} {cells} {spread:5.1f}%  {picked:8s} {faster:6s} "
          f"{by:>6s} {flag}")
for n in notes:
    print(n)
print("(pairs/SM: nq x nd over the device's SMs; spread: the largest (max - min) / mean of a side's rounds; faster:"
      " of the ring and the grid sides, 'by' how much the slower took longer; RULE-LOSES: the rule picked the slower"
      " by more than 1%)")
print("the rule picked the slower kernel by more than 1% on: " + (", ".join(losses) if losses else "none") +
      (f"; not compared (no ring or no grid rows): {', '.join(uncompared)}" if uncompared else ""))
EOF
  grep -E "^round [0-9]+ \S+: rc" "$A" || echo "every gpu_bench process exited 0"
} >> "$S"
# The section's status: non-zero when any gpu_bench process failed (those are listed above).
! grep -qE "^round [0-9]+ \S+: rc" "$A"
