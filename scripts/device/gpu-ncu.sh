# SPDX-License-Identifier: Apache-2.0
# A full Nsight Compute profile of one kernel of one benchmark shape (a machine with an NVIDIA GPU), for the "what the profile
# shows" of docs/cuda.md: NCU_SHAPE (default visual), NCU_KERNEL (a regex, default ExactWgmma), NCU_SKIP (launches
# of that kernel skipped first: warm-up, default 3), NCU_COUNT (launches profiled, default 1). Keeps the report, its details page, and the SASS lines with
# the most warp-stall samples (the source page), and prints the headline figures.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_gpu_bench maxsim_plugin_cuda || exit 1
command -v ncu > /dev/null || { echo "gpu-ncu: ncu not found"; exit 1; }
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
shape=${NCU_SHAPE:-visual} kernel=${NCU_KERNEL:-ExactWgmma}
S="$OUT/summary-gpu-ncu.txt"
R="$OUT/ncu-$shape"
timeout 300 ncu --clock-control none --set full --import-source no -k "regex:$kernel" \
  --launch-skip "${NCU_SKIP:-3}" --launch-count "${NCU_COUNT:-1}" -f -o "$R" "$B" --only "$shape" > "$R.log" 2>&1
rc=$?
ncu --import "$R.ncu-rep" --page details > "$R-details.txt" 2>&1
ncu --import "$R.ncu-rep" --page source --csv --print-source sass > "$R-sass.csv" 2>&1
{
  echo "ncu --set full, $shape, kernel /$kernel/: rc $rc"
  grep -E "^  [A-Za-z].*\(|Duration|Elapsed Cycles|SM Frequency|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Issue Slots Busy|Issued Ipc|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Executed Ipc|Achieved Occupancy|Dynamic Shared" "$R-details.txt" | head -40
  # The source page: one row per SASS instruction with its stall samples; the 25 most-sampled lines.
  python3 - "$R-sass.csv" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if "Source" in r), None)
if hdr is None:
    print("no source page"); sys.exit(0)
h = rows[hdr]; body = [r for r in rows[hdr + 1:] if len(r) == len(h)]
def col(name):
    return next((i for i, c in enumerate(h) if c.startswith(name)), None)
src, samp = col("Source"), col("Warp Stall Sampling (All")
if samp is None:
    print("columns:", h[:12]); sys.exit(0)
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return 0.0
total = sum(num(r[samp]) for r in body) or 1.0
print(f"stall samples: {total:.0f} over {len(body)} SASS lines; top 25:")
for r in sorted(body, key=lambda r: -num(r[samp]))[:25]:
    print(f"  {100 * num(r[samp]) / total:5.1f}%  {r[src][:110]}")
EOF
} > "$S"
[ $rc -eq 0 ]
