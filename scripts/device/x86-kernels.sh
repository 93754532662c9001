# SPDX-License-Identifier: Apache-2.0
# x86 kernels on the GPU machine's CPU (AVX-512, AMX), self-contained: its own build (no CUDA, so it does not depend on
# the plugin building), instruction peaks and semantics (isa_probe), the whole test suite but the 4 GiB
# buffer test, kernel_bench (canonical shapes on one pinned core with top-k, Lq=Ld=1024, bf16, thread
# scaling on pinned cores, the real embeddings; d=64/96 with X86_FULL=1), and cpu_bench (the project's
# benchmark, with OpenBLAS/oneDNN baselines) when X86_CPU_BENCH=1.
# Logs: $OUT/x86-*.txt; summary: $OUT/summary-x86-kernels.txt.
set -uo pipefail
source scripts/device/env.sh
B=$PWD/build-device-x86
S=$OUT/summary-x86-kernels.txt
: > "$S"
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=OFF \
  -DMAXSIM_BLAS_DIR="$MAXSIM_BLAS_DIR" -DMAXSIM_BLAS_INCLUDE="$MAXSIM_BLAS_INCLUDE" > "$OUT/x86-build.txt" 2>&1
targets="maxsim_tests kernel_bench isa_probe"
[ "${X86_CPU_BENCH:-0}" = 1 ] && targets="$targets cpu_bench"
ninja -C "$B" -j"$NPROC" $targets >> "$OUT/x86-build.txt" 2>&1 || { tail -30 "$OUT/x86-build.txt"; exit 1; }
echo "## build: $(( $(date +%s) - t0 )) s" >> "$S"
KB="$B/benchmarks/kernel_bench"
KERNELS=${X86_KERNELS:-amx,avx512-vnni,avx-vnni,avx2}
{ echo "## isa_probe"; taskset -c 2 "$B/benchmarks/isa_probe"; } 2>&1 | tee "$OUT/x86-probe.txt" >> "$S"
t1=$(date +%s)
"$B/tests/maxsim_tests" --gtest_filter='-*4GiB*' > "$OUT/x86-tests.txt" 2>&1
{ echo "## tests ($(( $(date +%s) - t1 )) s)"; grep -E "PASSED|FAILED|tests ran|self-test|available|pruning .*nanofiqa.*dot" "$OUT/x86-tests.txt" | head -40; } >> "$S"
{
  echo "## kernel_bench, 1 thread (taskset core 2)"
  taskset -c 2 "$KB" --kernels "$KERNELS" --modes exact,certified,approximate \
    --shapes 32:180:1000:128,32:300:1000:128 --reps 5 --topk 10
  taskset -c 2 "$KB" --kernels "$KERNELS" --modes exact,certified,approximate --shapes 1024:1024:16:128 --reps 3
  taskset -c 2 "$KB" --kernels "${KERNELS%,*}" --modes exact,certified --dtypes bf16 --shapes 32:180:1000:128 --reps 3
  if [ "${X86_FULL:-0}" = 1 ]; then
    taskset -c 2 "$KB" --kernels "$KERNELS" --modes exact,certified --shapes 32:180:1000:64,32:180:1000:96 --reps 3
  fi
  echo "## kernel_bench, threads (pinned to cores 2..)"
  for t in 1 2 4 16; do
    cores="2-$((t + 1))"; [ "$t" = 16 ] && cores="0-15"
    taskset -c "$cores" "$KB" --kernels "${KERNELS%%,*}" --modes exact,certified,approximate \
      --shapes 32:180:1000:128 --threads "$t" --reps 7 | grep -v "^#\|^kernel"
  done
  echo "## real embeddings"
  "$KB" --kernels "${KERNELS%%,*}" --data "$MAXSIM_SHARED_DIR/data/colbert-nanofiqa"
} 2>&1 | tee "$OUT/x86-bench.txt" >> "$S"
if [ "${X86_CPU_BENCH:-0}" = 1 ]; then
  { echo "## cpu_bench (1 thread)";
    timeout 240 "$B/benchmarks/cpu_bench" --threads=1 --kernels="$KERNELS" --benchmark_min_time=0.2 \
      --benchmark_filter="${X86_CPU_BENCH_FILTER:-peak|maxsim/.*/(openblas|onednn|amx|avx512-vnni|avx2)/}" \
      --benchmark_out="$OUT/x86-cpu-bench.json" --benchmark_out_format=json 2>&1 | grep -E "^(peak|maxsim)|replicas" ;
  } 2>&1 | tee "$OUT/x86-cpu-bench.txt" >> "$S"
fi
# The FMA peaks again on the same core: the first reading, right after the build, has come out below what the
# kernels then sustained (the exact kernel's GSO/s above the zmm FMA peak), so the efficiency is taken
# against the higher of the two readings.
{ echo "## isa_probe peaks again, after the benchmarks"; taskset -c 2 "$B/benchmarks/isa_probe" | grep "^peak"; } 2>&1 |
  tee -a "$OUT/x86-probe.txt" >> "$S"
echo "## total: $(( $(date +%s) - t0 )) s" >> "$S"
