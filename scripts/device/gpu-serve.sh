# SPDX-License-Identifier: Apache-2.0
# The serving-batch shapes alone (a machine with an NVIDIA GPU), as gpu-bench records them but in a fraction of
# its time: builds the plugin, the GPU suite and the benchmark; runs the batch kernel's GPU tests (and the other
# wgmma and folded-check tests); times the serving shapes (gpu_bench), the in-run cuBLAS rate (baselines.py) and
# the peers on the same shapes (peers.py, wheels from .whl/); one result file (report.py) like gpu-bench's.
# GPU_SERVE_VARIANTS (optional): a space-separated list of batch-kernel settings, each a comma-separated list of
# VAR=VALUE (e.g. "MAXSIM_CUDA_BATCH_AHEAD=3 MAXSIM_CUDA_BATCH_AHEAD=1,MAXSIM_CUDA_BATCH_ROWS=128"): each one's
# batch tests and serving rows run after the default's, in the same call, and a table of them is printed last
# (GPU_SERVE_VARIANT_TESTS=0: without the tests; GPU_SERVE_VARIANT_SHAPES: fewer shapes; GPU_SERVE_VARIANT_ROUNDS=N:
# the list's serving rows N times in turn, variant after variant, an A/B of settings, tests once). GPU_SERVE_PEERS=0
# skips the peers. With .carry/base-prebuilt.tar.xz (another build's binaries, packed like make-carry's prebuilt
# archive) the serving rows also run on that build (under GPU_SERVE_BASE_ENV, e.g. a setting it needs to match a
# schedule), alternating with this one, GPU_SERVE_AB_ROUNDS rounds (default 1) on GPU_SERVE_AB_SHAPES (default
# serve-textual-10k-64q; GPU_SERVE_AB_ROWS=kernel: their kernel rows only, MAXSIM_GPU_BENCH_ROWS).
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench maxsim || exit 1
S="$OUT/summary-gpu-serve.txt"
: > "$S"
SHAPES="serve-textual-10k-64q serve-colpali-16q"
MAXSIM_GPU_TESTS_REQUIRE=1 timeout 200 "$BUILD/tests/gpu/maxsim_gpu_tests" \
  --gtest_filter='Gpu.QueryBatch*:Gpu.LongQuery*:Gpu.FoldedInput*:Gpu.CandidatesPairsAndTopK' > "$OUT/gpu-serve-tests.txt" 2>&1
trc=$?
grep -E "MAXSIM_TEST_SEED|^\[  (PASSED|FAILED) |^\[       OK" "$OUT/gpu-serve-tests.txt" >> "$S"
grep -B2 -A12 "Failure" "$OUT/gpu-serve-tests.txt" | head -40 >> "$S"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader || true
  grep -m1 "Model name" /proc/cpuinfo 2> /dev/null; nproc; } > "$OUT/gpu-machine.txt" 2>&1
: > "$OUT/gpu-bench.json"
brc=0
for s in $SHAPES; do
  timeout 120 "$BUILD/benchmarks/gpu/maxsim_gpu_bench" --only "$s" --json "$OUT/bench-$s.json" > "$OUT/bench-$s.txt" 2>&1 || brc=1
  cat "$OUT/bench-$s.json" >> "$OUT/gpu-bench.json"
done
# Each variant in a fresh process (the settings are read when the backend is created): its batch tests, then its
# serving rows (exact, kernel-only on a packed corpus).
V="$OUT/gpu-serve-variants.txt"
: > "$V"
for r in $(seq "${GPU_SERVE_VARIANT_ROUNDS:-1}"); do
  i=0
  for v in ${GPU_SERVE_VARIANTS:-}; do
    i=$((i + 1))
    env_args=(${v//,/ })
    vt=skipped
    if [ "${GPU_SERVE_VARIANT_TESTS:-1}" != 0 ] && [ "$r" = 1 ]; then
      env "${env_args[@]}" MAXSIM_GPU_TESTS_REQUIRE=1 timeout 200 "$BUILD/tests/gpu/maxsim_gpu_tests" \
        --gtest_filter='Gpu.QueryBatch*' > "$OUT/gpu-serve-tests-v$i.txt" 2>&1
      vt=$?
      [ $vt -eq 0 ] || trc=$vt
    fi
    for s in ${GPU_SERVE_VARIANT_SHAPES:-$SHAPES}; do
      env "${env_args[@]}" timeout 120 "$BUILD/benchmarks/gpu/maxsim_gpu_bench" --only "$s" \
        > "$OUT/bench-$s-v$i-r$r.txt" 2>&1 || brc=1
      grep -E "^$s +exact " "$OUT/bench-$s-v$i-r$r.txt" | sed "s|^|round $r $v tests-rc=$vt  |" >> "$V"
    done
  done
done
A="$OUT/gpu-serve-ab.txt"
: > "$A"
if base_build; then
  new_rev=$(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here)
  echo "base: $BASE_REV ${GPU_SERVE_BASE_ENV:-}; new: $new_rev" >> "$A"
  read -ra base_env <<< "${GPU_SERVE_BASE_ENV:-}"
  for r in $(seq "${GPU_SERVE_AB_ROUNDS:-1}"); do
    for s in ${GPU_SERVE_AB_SHAPES:-serve-textual-10k-64q}; do
      for side in base new; do
        dir=$BUILD; e=()
        [ "$side" = base ] && dir=/tmp/maxsim-base && e=("${base_env[@]}")
        env "${e[@]}" ${GPU_SERVE_AB_ROWS:+MAXSIM_GPU_BENCH_ROWS=$GPU_SERVE_AB_ROWS} \
          LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" MAXSIM_PLUGIN_PATH="$dir" timeout 120 \
          "$dir/benchmarks/gpu/maxsim_gpu_bench" --only "$s" > "$OUT/ab-$side-$s-$r.txt" 2>&1 || brc=1
        grep -E "^$s +exact " "$OUT/ab-$side-$s-$r.txt" | sed "s|^|round $r $side  |" >> "$A"
      done
    done
  done
fi
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/gpu/baselines.py --json "$OUT/gpu-baselines.json" > "$OUT/gpu-baselines.txt" 2>&1
[ "${GPU_SERVE_PEERS:-1}" != 0 ] && peer_wheels
LIB=$(ls "$BUILD"/libmaxsim.so 2> /dev/null || ls "$BUILD"/libmaxsim.so.* | head -1)
[ "${GPU_SERVE_PEERS:-1}" != 0 ] && PYTHONUNBUFFERED=1 timeout 300 python3 benchmarks/gpu/peers.py --lib "$LIB" \
  --json "$OUT/peers.json" --shapes "$SHAPES" > "$OUT/peers.txt" 2>&1
python3 benchmarks/gpu/report.py --bench "$OUT/gpu-bench.json" --baselines "$OUT/gpu-baselines.json" \
  --peers "$OUT/peers.json" --machine "$OUT/gpu-machine.txt" --combine "$OUT/gpu-result-serve.json" \
  --revision "$(tree_revision)" \
  --command "$(run_command 'NCU_[A-Z_]+' gpu-serve)" > "$OUT/gpu-report-serve.md"
{ cat "$OUT"/bench-*.txt | grep -E "^serve"; python3 benchmarks/gpu/report.py --result "$OUT/gpu-result-serve.json" --brief
  [ -s "$V" ] && { echo "variants (exact rows):"; cat "$V"; }
  [ -s "$A" ] && { echo "A/B (exact rows):"; cat "$A"; }
  echo "tests rc $trc, bench rc $brc"; } >> "$S"
[ $trc -eq 0 ] && [ $brc -eq 0 ]
