# SPDX-License-Identifier: Apache-2.0
# GPU benchmarks (a machine with an NVIDIA GPU): libmaxsim's CUDA plugin on the benchmark shapes (bf16, median of CUDA-event-
# timed calls after warm-up), with in-run baselines (cuBLAS bf16 rate, device copy bandwidth, naive PyTorch
# einsum + amax + sum at fp32), one Nsight Compute speed-of-light profile of the main kernels, and one table.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_gpu_bench maxsim_plugin_cuda || exit 1
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
timeout 240 "$B" --json "$OUT/gpu-bench.json" > "$OUT/gpu-bench.txt" 2>&1
brc=$?
# The long-query exact kernel with and without wgmma (docs/cuda.md), in the same run.
if [ "${MAXSIM_GPU_VARIANTS:-1}" = 1 ]; then
  for v in default MAXSIM_CUDA_WGMMA=0; do
    for shape in q128 visual; do
      line=$(env ${v/default/MAXSIM_NOTHING=1} timeout 60 "$B" --only $shape 2>&1 | grep -E "^$shape +exact ")
      echo "$v $line"
    done
  done > "$OUT/gpu-variants.txt"
fi
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/gpu/baselines.py --json "$OUT/gpu-baselines.json" > "$OUT/gpu-baselines.txt" 2>&1
prc=$?
if [ "${MAXSIM_GPU_PROFILE:-1}" = 1 ] && command -v ncu > /dev/null; then
  for shape in textual-10k q128 visual; do
    timeout 240 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      -k "regex:ExactTc|ExactWgmma|Screen" --launch-skip 34 --launch-count 2 "$B" --only $shape > "$OUT/ncu-$shape.txt" 2>&1
  done
fi
# Local memory in a kernel's SASS (a spilled or dynamically indexed array) costs L2 traffic per thread: nvcc 13
# once put a fold's partial maxima there (1.8 GB of local traffic per visual call). Listed, not fatal.
# (The plugin library is built above: without it cuobjdump would read nothing and the list would look empty.)
if command -v cuobjdump > /dev/null && [ -f "$BUILD/libmaxsim-plugin-cuda.so" ]; then
  cuobjdump -sass "$BUILD/libmaxsim-plugin-cuda.so" 2> /dev/null |
    awk '/Function :/{f=$3} /LDL|STL/{n[f]++} END{for (k in n) print n[k], k}' | sort -rn > "$OUT/sass-local.txt"
fi
python3 benchmarks/gpu/report.py "$OUT/gpu-bench.json" "$OUT/gpu-baselines.json" > "$OUT/summary-gpu-bench.txt"
echo "bench rc $brc, baselines rc $prc" >> "$OUT/summary-gpu-bench.txt"
[ -f "$OUT/sass-local.txt" ] && { echo "--- kernels with local-memory loads/stores in SASS: $(wc -l < "$OUT/sass-local.txt")"; head -n 8 "$OUT/sass-local.txt"; } >> "$OUT/summary-gpu-bench.txt"
[ -f "$OUT/gpu-variants.txt" ] && { echo "--- long-query exact kernel variants"; cat "$OUT/gpu-variants.txt"; } >> "$OUT/summary-gpu-bench.txt"
for f in "$OUT"/ncu-*.txt; do
  [ -f "$f" ] && { echo "--- $(basename "$f")"; grep -E "ExactTc|ExactWgmma|Screen|Duration|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|DRAM Throughput" "$f" | head -24; } >> "$OUT/summary-gpu-bench.txt"
done
[ $brc -eq 0 ]
