# SPDX-License-Identifier: Apache-2.0
# A/B timing of the GPU benchmark (a machine with an NVIDIA GPU): the revision in .carry/base-src (made by
# `MAXSIM_BASE_REV=<rev> bash scripts/make-carry.sh`) against the working tree, on the benchmark's exact shapes.
# The two gpu_bench binaries run alternately, one process per run (MAXSIM_AB_ROUNDS rounds, default 3), so
# that both see the same machine state; the table gives each side's median and new / base.
set -uo pipefail
source scripts/device/env.sh
S="$OUT/summary-gpu-ab.txt"
if [ ! -d .carry/base-src ]; then
  echo "gpu-ab: no .carry/base-src (run MAXSIM_BASE_REV=<rev> bash scripts/make-carry.sh here)" | tee "$S"
  exit 1
fi
# Two measurement builds of their own, for the H100's sm_90a only (a third of the plugin's compile time).
BASE_BUILD=$PWD/build-ab-base NEW_BUILD=$PWD/build-ab-new
for pair in ".carry/base-src:$BASE_BUILD" ".:$NEW_BUILD"; do
  src=${pair%%:*} dir=${pair#*:}
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
      -DMAXSIM_BLAS_DIR="$MAXSIM_BLAS_DIR" -DMAXSIM_BLAS_INCLUDE="$MAXSIM_BLAS_INCLUDE" > "$OUT/ab-cmake-$(basename "$dir").log" 2>&1 || exit 1
  fi
done
# Both builds at once: each is mostly a few long nvcc jobs.
ninja -C "$BASE_BUILD" -j"$NPROC" maxsim_gpu_bench > "$OUT/ab-build-base.log" 2>&1 &
ninja -C "$NEW_BUILD" -j"$NPROC" maxsim_gpu_bench > "$OUT/ab-build-new.log" 2>&1 || exit 1
wait $! || exit 1
shapes=${MAXSIM_AB_SHAPES:-"textual-1k textual-10k colpali-rerank q128 visual"}
rounds=${MAXSIM_AB_ROUNDS:-3}
: > "$OUT/gpu-ab.txt"
for shape in $shapes; do
  for r in $(seq "$rounds"); do
    for side in base new; do
      b=$BASE_BUILD/benchmarks/gpu/maxsim_gpu_bench
      [ $side = new ] && b=$NEW_BUILD/benchmarks/gpu/maxsim_gpu_bench
      timeout 60 "$b" --only "$shape" 2>&1 | awk -v s=$side -v sh="$shape" '$1 == sh && $2 == "exact" {print s, sh, $3}' >> "$OUT/gpu-ab.txt"
    done
  done
done
{
  echo "A/B (exact, ms; $rounds alternating rounds, one process each): base = $(cat .carry/base-src/REV 2>/dev/null)"
  python3 - "$OUT/gpu-ab.txt" <<'PY'
import sys, statistics, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
order = []
for line in open(sys.argv[1]):
    side, shape, ms = line.split()
    if shape not in order: order.append(shape)
    t[shape][side].append(float(ms))
print(f"{'shape':16} {'base':>8} {'new':>8} {'new/base':>9}   runs base | new")
for sh in order:
    b, n = t[sh]["base"], t[sh]["new"]
    if not b or not n:
        print(f"{sh:16} missing: base {b} new {n}"); continue
    mb, mn = statistics.median(b), statistics.median(n)
    print(f"{sh:16} {mb:8.4f} {mn:8.4f} {mn/mb:9.3f}   {' '.join(f'{x:.4f}' for x in b)} | {' '.join(f'{x:.4f}' for x in n)}")
PY
} > "$S"
cat "$S"
