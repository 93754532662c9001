#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The training step (a machine with an NVIDIA GPU): the GPU tests matching GPU_TEST_FILTER (default the backward
# tests), then `maxsim_gpu_bench --only train` (in-batch 64 x 64, forward + backward: kernel rows and public-API
# rows) of this tree, of each GPU_TRAIN_VARIANTS entry ("name:VAR=value,VAR2=value": this tree under those
# settings) and of .carry/base-prebuilt.tar.xz (another revision's binaries, packed like make-carry's prebuilt
# archive) when present, alternated round by round (GPU_TRAIN_ROUNDS, default 3), one process per run; then Nsight
# Compute's duration of each kernel of the first training steps of every side (GPU_TRAIN_NCU_LAUNCHES launches,
# default 20: the step's per-kernel split; kernels of the library and CUB only) and of its atomic grad_D kernel.
# Prints the median of every row per side.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench || exit 1
S="$OUT/summary-gpu-train.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
  echo "new: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here)"; } > "$S"
MAXSIM_GPU_TESTS_REQUIRE=1 timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" \
  --gtest_filter="${GPU_TEST_FILTER:-Gpu.Backward*:Gpu.DeterministicGradD*:Gpu.ErrorsAreStatuses}" > "$OUT/gpu-train-tests.txt" 2>&1
rc=$?
{ grep -E "^\[  (PASSED|FAILED) |^\[       OK|tests ran" "$OUT/gpu-train-tests.txt"
  grep -B2 -A12 "Failure" "$OUT/gpu-train-tests.txt" | head -40; echo "gpu tests: rc $rc"; } >> "$S"
sides=("new:")
for v in ${GPU_TRAIN_VARIANTS:-}; do sides+=("$v"); done
if base_build; then
  sides=("base:" "${sides[@]}")
  echo "base: $BASE_REV" >> "$S"
fi
# run_side SIDE PREFIX...: the benchmark of SIDE ("name:VAR=value,..."), its command line after PREFIX.
run_side() {
  local name=${1%%:*} vars=${1#*:}
  shift
  local dir=$BUILD envs=()
  [ "$name" = base ] && dir=/tmp/maxsim-base
  [ -n "$vars" ] && IFS=, read -ra envs <<< "$vars"
  env "${envs[@]}" LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" MAXSIM_PLUGIN_PATH="$dir" "$@" \
    "$dir/benchmarks/gpu/maxsim_gpu_bench" --only train
}
: > "$OUT/train-rows.txt"
for r in $(seq "${GPU_TRAIN_ROUNDS:-3}"); do
  for side in "${sides[@]}"; do
    run_side "$side" timeout 120 2>&1 | awk -v s="${side%%:*}" '$1 == "train-inbatch" {print s, $2, $3}' >> "$OUT/train-rows.txt"
  done
done
if command -v ncu > /dev/null; then
  for side in "${sides[@]}"; do
    name=${side%%:*}
    run_side "$side" timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --kernel-name-base demangled -k "regex:mscuda|cub" --launch-count "${GPU_TRAIN_NCU_LAUNCHES:-20}" \
      > "$OUT/ncu-train-$name.csv" 2>&1
    run_side "$side" timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --kernel-name-base demangled -k "regex:GradDAtomic" --launch-count 3 > "$OUT/ncu-train-atomic-$name.csv" 2>&1
  done
fi
python3 - "$OUT" >> "$S" <<'EOF'
import collections, csv, glob, os, re, statistics, sys
out = sys.argv[1]
rows = collections.defaultdict(list)
order = []
for line in open(os.path.join(out, "train-rows.txt")):
    side, mode, ms = line.split()
    if (side, mode) not in rows: order.append((side, mode))
    rows[side, mode].append(float(ms))
print("train-inbatch, ms (median of the rounds; each round one process per side):")
for side, mode in order:
    v = rows[side, mode]
    print(f"  {side:12} {mode:20} {statistics.median(v):8.4f}   runs {' '.join(f'{x:.4f}' for x in v)}")
for path in sorted(glob.glob(os.path.join(out, "ncu-train-*.csv"))):
    data = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
    name = os.path.basename(path)[len("ncu-train-"):-4]
    if len(data) < 2 or "Kernel Name" not in data[0]:
        print(f"ncu {name}: no kernel rows"); continue
    h = data[0]
    k, u, v = h.index("Kernel Name"), h.index("Metric Unit"), h.index("Metric Value")
    print(f"ncu {name}: kernel durations in launch order")
    for r in data[1:]:
        kernel = re.split(r"[<(]", re.sub(r"^void |(\(anonymous namespace\)|<?unnamed>)::", "", r[k]))[0]
        print(f"  {kernel[-48:]:48} {r[v]:>10} {r[u]}")
EOF
cat "$S"
exit $rc
