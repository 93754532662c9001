# SPDX-License-Identifier: Apache-2.0
# GPU benchmarks (a machine with an NVIDIA GPU): libmaxsim's CUDA plugin on the benchmark shapes, side by side:
# kernel-only (internal calls timed with CUDA events), the public C API (GPU tensors in and out; a resident packed
# corpus with host queries), and the Triton peers (late-interaction-kernels, flash-maxsim) on the same torch
# tensors through benchmarks/gpu/peers.py, one process per shape; in-run baselines (plain read kernel, device
# copy, cuBLAS bf16, naive PyTorch) and the synchronous call's floor in plain CUDA (benchmarks/gpu/api_floor_probe.cu:
# a launch and its wait, and a textual-1k-sized call with its query through a pinned stage, which the public calls'
# overheads are read against); one result file and its tables (benchmarks/gpu/report.py).
# The peers come from their PyPI wheels, carried in .whl/ (docs/cuda.md, "Benchmarks"); without them their rows
# say "not importable". So does the Python binding (peers.py's libmaxsim-py rows): the maxsim wheel that
# scripts/make-py-wheels.sh builds into .whl/ from this checkout (its revision is named in the machine lines);
# it loads the CUDA plugin of $BUILD.
# Knobs: MAXSIM_GPU_VARIANTS=1 (long-query kernel variants), MAXSIM_GPU_PROFILE=1 (Nsight Compute speed of light),
# GPU_PEER_SHAPES (shapes for peers.py, default all).
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_gpu_bench maxsim_plugin_cuda maxsim maxsim_api_floor_probe || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader || true
  grep -m1 "Model name" /proc/cpuinfo 2> /dev/null || lscpu | grep -m1 "Model name"; nproc
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1
} > "$OUT/gpu-machine.txt" 2>&1
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
timeout 300 "$B" --json "$OUT/gpu-bench.json" > "$OUT/gpu-bench.txt" 2>&1
brc=$?
# The long-query exact kernel with and without wgmma (docs/cuda.md), in the same run.
if [ "${MAXSIM_GPU_VARIANTS:-0}" = 1 ]; then
  for v in default MAXSIM_CUDA_WGMMA=0; do
    for shape in q128 visual; do
      line=$(env ${v/default/MAXSIM_NOTHING=1} timeout 60 "$B" --only $shape 2>&1 | grep -E "^$shape +exact ")
      echo "$v $line"
    done
  done > "$OUT/gpu-variants.txt"
fi
PROBE=$BUILD/benchmarks/gpu/maxsim_api_floor_probe
frc=0
if [ -x "$PROBE" ]; then
  timeout 120 "$PROBE" --query-bytes 8192 --json "$OUT/api-floor-probe.json" > "$OUT/api-floor-probe.txt" 2>&1 || frc=$?
else
  echo "api_floor_probe: not built here (a prebuilt archive without it)" > "$OUT/api-floor-probe.txt"
fi
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/gpu/baselines.py --json "$OUT/gpu-baselines.json" > "$OUT/gpu-baselines.txt" 2>&1
prc=$?
peer_wheels
[ -f .whl/maxsim-wheel-rev.txt ] && echo "maxsim wheel (the binding's rows): $(cat .whl/maxsim-wheel-rev.txt)" >> "$OUT/gpu-machine.txt"
LIB=$(ls "$BUILD"/libmaxsim.so 2> /dev/null || ls "$BUILD"/libmaxsim.so.* | head -1)
PYTHONUNBUFFERED=1 timeout 900 python3 benchmarks/gpu/peers.py --lib "$LIB" --json "$OUT/peers.json" \
  ${GPU_PEER_SHAPES:+--shapes "$GPU_PEER_SHAPES"} > "$OUT/peers.txt" 2>&1
pprc=$?
if [ "${MAXSIM_GPU_PROFILE:-0}" = 1 ] && command -v ncu > /dev/null; then
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
floor_arg=()
[ -f "$OUT/api-floor-probe.json" ] && floor_arg=(--floor "$OUT/api-floor-probe.json")
python3 benchmarks/gpu/report.py --bench "$OUT/gpu-bench.json" --baselines "$OUT/gpu-baselines.json" \
  --peers "$OUT/peers.json" --machine "$OUT/gpu-machine.txt" --combine "$OUT/gpu-result.json" \
  "${floor_arg[@]}" \
  --revision "$(tree_revision)" \
  --command "$(run_command 'PY_CUDA_[A-Z_]+' gpu-bench)" > "$OUT/gpu-report.md"
{
  python3 benchmarks/gpu/report.py --result "$OUT/gpu-result.json" --brief
  python3 benchmarks/gpu/report.py --result "$OUT/gpu-result.json" --clock
  echo "bench rc $brc, baselines rc $prc, peers rc $pprc, floor probe rc $frc"
  [ -f "$OUT/sass-local.txt" ] && { echo "--- kernels with local-memory loads/stores in SASS: $(wc -l < "$OUT/sass-local.txt")"; head -n 8 "$OUT/sass-local.txt"; }
  [ -f "$OUT/gpu-variants.txt" ] && { echo "--- long-query exact kernel variants"; cat "$OUT/gpu-variants.txt"; }
  for f in "$OUT"/ncu-*.txt; do
    [ -f "$f" ] && { echo "--- $(basename "$f")"; grep -E "ExactTc|ExactWgmma|Screen|Duration|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|DRAM Throughput" "$f" | head -24; }
  done
} > "$OUT/summary-gpu-bench.txt"
[ $brc -eq 0 ]
