# x86 kernels (issue 3) on the device CPU, self-contained: its own build (no CUDA, so it does not depend on
# the plugin building), instruction peaks and semantics (isa_probe), the whole test suite but the 4 GiB
# buffer test, kernel_bench (canonical shapes on one pinned core, Lq=Ld=1024, d=64/96, thread scaling, the
# real embeddings), and cpu_bench (the project's benchmark, with OpenBLAS/oneDNN baselines) when X86_CPU_BENCH=1.
# Logs: $OUT/x86-*.txt; summary: $OUT/summary-x86-kernels.txt.
set -uo pipefail
source scripts/device/env.sh
B=$PWD/build-device-x86
S=$OUT/summary-x86-kernels.txt
: > "$S"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=OFF \
  -DMAXSIM_BLAS_DIR="$MAXSIM_BLAS_DIR" -DMAXSIM_BLAS_INCLUDE="$MAXSIM_BLAS_INCLUDE" > "$OUT/x86-build.txt" 2>&1
targets="maxsim_tests kernel_bench isa_probe"
[ "${X86_CPU_BENCH:-0}" = 1 ] && targets="$targets cpu_bench"
ninja -C "$B" -j"$NPROC" $targets >> "$OUT/x86-build.txt" 2>&1 || { tail -30 "$OUT/x86-build.txt"; exit 1; }
KB="$B/benchmarks/kernel_bench"
KERNELS=${X86_KERNELS:-amx,avx512-bf16,avx512-vnni,avx2}
{ echo "## isa_probe"; taskset -c 2 "$B/benchmarks/isa_probe"; } 2>&1 | tee "$OUT/x86-probe.txt" >> "$S"
"$B/tests/maxsim_tests" --gtest_filter='-*4GiB*' > "$OUT/x86-tests.txt" 2>&1
{ echo "## tests"; grep -E "PASSED|FAILED|tests ran|self-test|available" "$OUT/x86-tests.txt" | head -30; } >> "$S"
{
  echo "## kernel_bench, 1 thread (taskset core 2)"
  taskset -c 2 "$KB" --kernels "$KERNELS" --modes exact,certified,approximate --dtypes f32,bf16 \
    --shapes 32:180:1000:128,32:300:1000:128 --reps 7
  taskset -c 2 "$KB" --kernels "$KERNELS" --modes exact,certified,approximate --shapes 32:180:50:128,1024:1024:16:128 --reps 5
  taskset -c 2 "$KB" --kernels "$KERNELS" --modes exact,certified --shapes 32:180:1000:64,32:180:1000:96 --reps 3
  echo "## kernel_bench, threads"
  "$KB" --kernels "${KERNELS%%,*}" --modes exact,certified --shapes 32:180:1000:128 --threads 1,2,4,16 --reps 7
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
