#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Timelines of the public calls (a machine with an NVIDIA GPU; the device image has no Nsight Systems): gpu_bench's
# API rows (GPU_TRACE_SHAPES, default textual-10k, visual and the training step) and the same public calls from
# Python (benchmarks/gpu/api_timeline.py), each once under the CUPTI tracer benchmarks/gpu/cupti_trace.cc (every
# API call, kernel, copy and memset; built here with g++ against the CUDA toolkit's CUPTI, or GPU_TRACE_LIB, a
# prebuilt one, with its libcupti beside it) and once without it (clean times). The GPU's clocks, power and
# throttle reasons are sampled every 100 ms meanwhile (clocks.csv), and every benchmark line carries the time it
# was printed, so clocks and rows can be matched. benchmarks/gpu/trace_report.py prints where each call's time goes.
# A prebuilt tracer, made where the CUDA toolkit has CUPTI (its libcupti.so.13 copied beside it, both carried):
#   g++ -O2 -shared -fPIC -fvisibility=hidden -I/usr/local/cuda/include benchmarks/gpu/cupti_trace.cc \
#       -L/usr/local/cuda/lib -lcupti -o DIR/libmaxsim_cupti_trace.so; then GPU_TRACE_LIB=$PWD/DIR/libmaxsim_cupti_trace.so
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-trace.txt"
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
LIB=$(ls "$BUILD"/libmaxsim.so 2> /dev/null || ls "$BUILD"/libmaxsim.so.* | head -1)
T=${GPU_TRACE_LIB:-}
if [ -z "$T" ]; then
  inc=$(dirname "$(find /usr/local/cuda*/ /usr/local/lib/python3*/ /usr/lib/python3*/ -name cupti.h 2> /dev/null | head -1)")
  lib=$(dirname "$(find /usr/local/cuda*/ /usr/local/lib/python3*/ /usr/lib/python3*/ -name 'libcupti.so*' 2> /dev/null | head -1)")
  T=/tmp/libmaxsim_cupti_trace.so
  g++ -O2 -shared -fPIC -fvisibility=hidden -I"$inc" benchmarks/gpu/cupti_trace.cc -L"$lib" -l:"$(ls "$lib" | grep -m1 '^libcupti.so')" \
    -Wl,-rpath,"$lib" -o "$T" > "$OUT/trace-build.txt" 2>&1 || { echo "tracer build failed" >> "$S"; cat "$OUT/trace-build.txt" >> "$S"; exit 1; }
fi
export LD_LIBRARY_PATH="$(dirname "$T"):$LD_LIBRARY_PATH"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1; echo "binaries: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here)"; } > "$S"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 100 > "$OUT/clocks.csv" 2>&1 &
smi=$!
stamp() { while IFS= read -r l; do echo "$(date +%H:%M:%S.%N | cut -c1-12) $l"; done; }
shapes=${GPU_TRACE_SHAPES:-textual-10k,visual,train}
rc=0
for traced in 1 0; do
  tag=$([ $traced = 1 ] && echo traced || echo clean)
  inj=()
  [ $traced = 1 ] && inj=(CUDA_INJECTION64_PATH="$T" MAXSIM_TRACE_OUT="$OUT/trace-bench.tsv")
  env "${inj[@]}" MAXSIM_GPU_BENCH_ROWS=api MAXSIM_PLUGIN_PATH="$BUILD" timeout 240 "$B" --only "$shapes" \
    --json "$OUT/bench-$tag.json" 2>&1 | stamp > "$OUT/bench-$tag.txt" || rc=1
  [ $traced = 1 ] && inj=(CUDA_INJECTION64_PATH="$T" MAXSIM_TRACE_OUT="$OUT/trace-py.tsv")
  env "${inj[@]}" PYTHONUNBUFFERED=1 MAXSIM_PLUGIN_PATH="$BUILD" timeout 240 python3 benchmarks/gpu/api_timeline.py \
    --lib "$LIB" --json "$OUT/py-$tag.json" 2>&1 | stamp > "$OUT/py-$tag.txt" || rc=1
done
kill $smi 2> /dev/null
for f in bench-clean bench-traced py-clean py-traced; do
  echo "--- $f"
  grep -E "api-|dense-kernels|kernel-wall|plugin-resident|fwd|py |exact " "$OUT/$f.txt" | cut -c1-140
done >> "$S"
for t in bench py; do
  echo "=== timeline: $t" >> "$S"
  python3 benchmarks/gpu/trace_report.py "$OUT/trace-$t.tsv" --calls 1 > "$OUT/report-$t.txt" 2>&1 || rc=1
  python3 benchmarks/gpu/trace_report.py "$OUT/trace-$t.tsv" --calls 0 \
    --only "${GPU_TRACE_SUMMARY:-api-dense,dense-kernels,api-fwd,fwd+bwd,api-resident,kernel-wall,plugin-resident}" >> "$S" 2>&1
done
echo "clocks (MHz sm, mem; W; C; reasons) min/median/max of sm: $(cut -d, -f2 "$OUT/clocks.csv" | grep -oE '[0-9]+' | sort -n | awk '{a[NR]=$1} END {print a[1], a[int(NR/2)+1], a[NR]}')" >> "$S"
cat "$S"
exit $rc
