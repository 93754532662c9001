# SPDX-License-Identifier: Apache-2.0
# Full Nsight Compute profiles (a machine with an NVIDIA GPU), for the "what the profile shows" of docs/cuda.md.
# Default: one kernel of one benchmark shape of maxsim_gpu_bench: NCU_SHAPE (default visual), NCU_KERNEL (a regex,
# default ExactWgmma), NCU_SKIP (launches of that kernel skipped first: warm-up, default 3), NCU_COUNT (launches
# profiled, default 1), NCU_NAME_BASE (what the regex is matched against, ncu's --kernel-name-base: function by
# default; mangled tells template instances apart, e.g. NCU_KERNEL=DealtScheduleKernelILi12ELi2ELi8ELi2E for the
# dealt twin with the kernel's mma, as benchmarks/results/gpu-dealt-ncu-h100.json was profiled).
# NCU_PEERS="IMPL:SHAPE ...": instead, each implementation's kernel on a shape as peers.py calls it (IMPL lik,
# flash, flash-single or libmaxsim; the same tensors for all: peers.py's seed), one profile each (the first
# launch after 5 warm-up calls; a timing pass of peers.py on those shapes first, which also fills Triton's
# autotuning cache; NCU_PEERS_TIMING=0 skips it), then the profiles side by side (ncu_compare.py: launch shape, SM activity, DRAM and L2
# traffic, stalls, SASS opcodes) and the peers' compiled Triton kernels (PTX, SASS, launch metadata).
# Each profile keeps its report, details page, raw metrics, and the SASS lines with the most warp-stall samples.
# The GPU keeps its own clocks (--clock-control none); NCU_CACHE_CONTROL (default all: caches flushed before each
# pass) set to none profiles with whatever the caches hold, as back-to-back calls find them.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_gpu_bench maxsim_plugin_cuda maxsim || exit 1
command -v ncu > /dev/null || { echo "gpu-ncu: ncu not found"; exit 1; }
S="$OUT/summary-gpu-ncu.txt"
: > "$S"
# Per-SM activity spread and traffic, beside --set full (both modes: ncu_compare.py reads them).
EXTRA=sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum

# The pages of report $1 (.ncu-rep without the suffix) and its headline figures, appended to the summary.
report_pages() {
  local R=$1
  ncu --import "$R.ncu-rep" --page details > "$R-details.txt" 2>&1
  ncu --import "$R.ncu-rep" --page raw --csv > "$R-raw.csv" 2>&1
  ncu --import "$R.ncu-rep" --page source --csv --print-source sass > "$R-sass.csv" 2>&1
  {
    grep -E "^  [A-Za-z].*\(|Duration|Elapsed Cycles|SM Frequency|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Issue Slots Busy|Issued Ipc|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Executed Ipc|Achieved Occupancy|Dynamic Shared|Grid Size|Block Size|Waves Per SM" "$R-details.txt" | head -45
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
  } >> "$S"
}

if [ -z "${NCU_PEERS:-}" ]; then
  B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
  shape=${NCU_SHAPE:-visual} kernel=${NCU_KERNEL:-ExactWgmma}
  R="$OUT/ncu-$shape"
  timeout 300 ncu --clock-control none --cache-control "${NCU_CACHE_CONTROL:-all}" --set full --metrics "$EXTRA" \
    --import-source no --kernel-name-base "${NCU_NAME_BASE:-function}" -k "regex:$kernel" \
    --launch-skip "${NCU_SKIP:-3}" --launch-count "${NCU_COUNT:-1}" -f -o "$R" "$B" --only "$shape" > "$R.log" 2>&1
  rc=$?
  echo "ncu --set full, $shape, kernel /$kernel/: rc $rc" >> "$S"
  report_pages "$R"
  [ $rc -eq 0 ]
  exit
fi

peer_wheels
LIB=$(ls "$BUILD"/libmaxsim.so 2> /dev/null || ls "$BUILD"/libmaxsim.so.* | head -1)
shapes=$(for e in $NCU_PEERS; do echo "${e#*:}"; done | sort -u | tr '\n' ' ')
if [ "${NCU_PEERS_TIMING:-1}" != 0 ]; then
  PYTHONUNBUFFERED=1 timeout 400 python3 benchmarks/gpu/peers.py --lib "$LIB" --json "$OUT/peers.json" --shapes "$shapes" \
    > "$OUT/peers.txt" 2>&1
  echo "peers.py on $shapes: rc $?" >> "$S"
  grep -E "'kernel_ms'|error" "$OUT/peers.txt" | cut -c1-200 >> "$S"
fi
rc=0
cmp=()
for e in $NCU_PEERS; do
  impl=${e%%:*} shape=${e#*:}
  case $impl in libmaxsim) kernel=ExactTc ;; *) kernel=maxsim_fwd ;; esac
  R="$OUT/ncu-$impl-$shape"
  PYTHONUNBUFFERED=1 timeout 240 ncu --clock-control none --cache-control "${NCU_CACHE_CONTROL:-all}" --set full \
    --metrics "$EXTRA" --import-source no \
    --profile-from-start off -k "regex:$kernel" --launch-count 1 -f -o "$R" \
    python3 benchmarks/gpu/peers.py --lib "$LIB" --shape "$shape" --profile "$impl" --json - > "$R.log" 2>&1
  r=$?
  echo "ncu --set full, $impl on $shape, kernel /$kernel/: rc $r; $(grep -o "'configs'.*" "$R.log" | cut -c1-300)" >> "$S"
  [ $r -eq 0 ] || rc=1
  report_pages "$R"
  cmp+=("$impl/$shape=$R-raw.csv,$R-sass.csv")
done
python3 benchmarks/gpu/ncu_compare.py --json "$OUT/ncu-compare.json" "${cmp[@]}" > "$OUT/ncu-compare.md" 2>&1
# The peers' Triton kernels as compiled in this run (Triton's cache): PTX, SASS and launch metadata.
tc=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -d "$tc" ]; then
  for f in $(find "$tc" -name '*.cubin'); do
    cuobjdump -sass "$f" > "${f%.cubin}.sass" 2> /dev/null || nvdisasm "$f" > "${f%.cubin}.sass" 2> /dev/null
  done
  (cd "$tc" && find . \( -name '*.ptx' -o -name '*.json' -o -name '*.sass' \) -print0 |
    tar --null -T - -czf "$OUT/triton-kernels.tar.gz")
fi
cat "$OUT/ncu-compare.md" >> "$S"
[ $rc -eq 0 ]
