#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The public API's overhead (a machine with an NVIDIA GPU): the GPU suite on this tree (GPU_API_TESTS=0 skips it),
# then gpu_bench on the one-query retrieval shapes (GPU_API_SHAPES; "train" is the training step), whose rows hold
# kernel-only, the kernel with one synchronisation (kernel-wall), the steps of a resident call, the plugin's call and
# the public call; with
# .carry/base-prebuilt.tar.xz (libmaxsim, the plugin and gpu_bench of another revision, packed like make-carry's
# prebuilt archive, its PREBUILT_REV inside) the same shapes run on that build too, alternating with this one,
# one process per run (GPU_API_ROUNDS rounds); without it, GPU_API_BASE_ENV (e.g. "MAXSIM_CUDA_MAPPED_RESULTS=0") makes
# the base side this build run under those settings (the sides' order alternates between rounds). GPU_API_VARIANTS ("name:VAR=value[,VAR=value] ...") adds sides
# that run this build under other settings, on GPU_API_VARIANT_SHAPES (default: every shape), alternating with the
# others. GPU_API_SERVE_SHAPES (default serve-colpali-16q) runs this build once on those batch shapes: the plugin's
# matrix against the same work as candidate lists. GPU_API_NOTE is written into the result's context (what the
# sides are). Prints a table of microseconds over kernel-only per shape. Then (GPU_API_PROBE=0 skips them)
# api_floor_probe: the floors under such a call in plain CUDA (each way of waiting for a kernel and of getting an
# 8 KB and a 32 KB query to it), into api-floor-probe-{8k,32k}.json, and launch_probe: the device's own cost of a
# launch of the ring kernel's shape and of the peer's (empty kernels in a CUDA graph), into launch-probe.json.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench maxsim_api_floor_probe maxsim_launch_probe || exit 1
S="$OUT/summary-gpu-api.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1; echo "this tree: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here)"; } > "$S"
rc=0
if [ "${GPU_API_TESTS:-1}" = 1 ]; then
  MAXSIM_GPU_TESTS_REQUIRE=1 timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" > "$OUT/gpu-api-tests.txt" 2>&1
  rc=$?
  { grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/gpu-api-tests.txt"; grep -B2 -A12 "Failure" "$OUT/gpu-api-tests.txt" | head -40
    echo "gpu tests: rc $rc"; } >> "$S"
fi
sides=new
if base_build; then
  sides="base new"
  echo "base: $BASE_REV" >> "$S"
elif [ -n "${GPU_API_BASE_ENV:-}" ]; then
  sides="base new"
  echo "base: this build with $GPU_API_BASE_ENV" >> "$S"
fi
# gpu_bench with only the public path's rows (MAXSIM_GPU_BENCH_ROWS; a build without it runs every row).
# GPU_API_SAME_BENCH=1: every side runs this build's gpu_bench, with its own library and plugin (the public rows go
# through them; the kernel rows are this build's), so that a change of the benchmark itself does not enter the A/B.
run_bench() {  # side dir shape round [VAR=value ...]
  local side=$1 dir=$2 shape=$3 r=$4 bench=$2/benchmarks/gpu/maxsim_gpu_bench
  shift 4
  [ "${GPU_API_SAME_BENCH:-0}" = 1 ] && bench=$BUILD/benchmarks/gpu/maxsim_gpu_bench
  env "$@" MAXSIM_GPU_BENCH_ROWS=api LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" MAXSIM_PLUGIN_PATH="$dir" timeout 120 \
    "$bench" --only "$shape" --json "$OUT/api-$side-$shape-$r.json" \
    > "$OUT/api-$side-$shape-$r.txt" 2>&1 || { echo "gpu_bench $side $shape: rc $?" >> "$S"; rc=1; }
}
read -ra variants <<< "${GPU_API_VARIANTS:-}"
for v in "${variants[@]}"; do echo "variant ${v%%:*}: this build with ${v#*:}" >> "$S"; done
for r in $(seq "${GPU_API_ROUNDS:-1}"); do
  order=$sides
  [ $((r % 2)) = 0 ] && order=$(echo "$sides" | tr ' ' '\n' | tac | tr '\n' ' ')  # even rounds: the other side first
  for shape in ${GPU_API_SHAPES:-textual-1k textual-10k colpali-rerank q128 visual}; do
    for side in $order; do
      dir=$BUILD
      [ "$side" = base ] && [ -d /tmp/maxsim-base ] && dir=/tmp/maxsim-base
      base_env=()
      [ "$side" = base ] && [ "$dir" = "$BUILD" ] && read -ra base_env <<< "$GPU_API_BASE_ENV"
      run_bench "$side" "$dir" "$shape" "$r" "${base_env[@]}"
    done
    for v in "${variants[@]}"; do
      case " ${GPU_API_VARIANT_SHAPES:-$shape} " in *" $shape "*) ;; *) continue ;; esac
      IFS=, read -ra venv <<< "${v#*:}"
      run_bench "${v%%:*}" "$BUILD" "$shape" "$r" "${venv[@]}"
    done
  done
done
for shape in ${GPU_API_SERVE_SHAPES-serve-colpali-16q}; do run_bench new "$BUILD" "$shape" 1; done
base_rev=none
[ -n "${GPU_API_BASE_ENV:-}" ] && base_rev="this build with $GPU_API_BASE_ENV"
[ -d /tmp/maxsim-base ] && base_rev=$BASE_REV
python3 benchmarks/gpu/api_overhead.py "$OUT" --json "$OUT/gpu-api-result.json" \
  --command "$(run_command 'GPU_API_[A-Z_]+' gpu-api)" \
  --note "${GPU_API_NOTE:-}" \
  --date "$(date -u +%FT%TZ)" \
  --machine "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(nproc) host cores" \
  --revisions "new: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here); base: $base_rev" >> "$S"
PROBE=$BUILD/benchmarks/gpu/maxsim_api_floor_probe
if [ "${GPU_API_PROBE:-1}" = 1 ] && [ -x "$PROBE" ]; then
  for qb in 8192 32768; do
    timeout 120 "$PROBE" --query-bytes $qb --json "$OUT/api-floor-probe-$((qb / 1024))k.json" \
      > "$OUT/api-floor-probe-$((qb / 1024))k.txt" 2>&1 || { echo "api_floor_probe $qb: rc $?" >> "$S"; rc=1; }
    cat "$OUT/api-floor-probe-$((qb / 1024))k.txt" >> "$S"
  done
elif [ "${GPU_API_PROBE:-1}" = 1 ]; then
  echo "api_floor_probe: not built here (a prebuilt archive without it)" >> "$S"
fi
LPROBE=$BUILD/benchmarks/gpu/maxsim_launch_probe
if [ "${GPU_API_PROBE:-1}" = 1 ] && [ -x "$LPROBE" ]; then
  timeout 60 "$LPROBE" --json "$OUT/launch-probe.json" > "$OUT/launch-probe.txt" 2>&1 ||
    { echo "launch_probe: rc $?" >> "$S"; rc=1; }
  cat "$OUT/launch-probe.txt" >> "$S"
elif [ "${GPU_API_PROBE:-1}" = 1 ]; then
  echo "launch_probe: not built here (a prebuilt archive without it)" >> "$S"
fi
cat "$S"
exit $rc
