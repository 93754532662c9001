#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU (and AVX-512/AMX CPU) tests and benchmarks, on a machine with an NVIDIA GPU (written for an H100 with
# a Sapphire Rapids-class CPU). Prepare on a machine with the project's Debian packages, run on the GPU machine:
#   bash scripts/make-carry.sh                         # once: .carry/ with the prerequisites
#   bash scripts/device-run.sh [section ...]           # on the GPU machine, .carry/ beside the checkout
# Sections (default: all, in this order), each a file scripts/device/<section>.sh:
#   build       configure + build everything (library, tests, benchmarks, CUDA plugin) with g++ 13 / nvcc
#   cpu-tests   the whole CTest suite on that machine's CPU (every kernel the CPU supports: AVX-512, VNNI, AMX)
#   cpu-bench   CPU benchmarks (1/4/16 threads) with in-run baselines
#   gpu-tests   the GPU conformance suite against the CPU reference (+ compute-sanitizer on a small case)
#   gpu-bench   GPU benchmarks against in-run cuBLAS / copy-bandwidth / PyTorch baselines
#   gpu-multi   several GPUs: the GPU suite with corpora sharded over all of them, and the scaling benchmark
#   gpu-focus   a development round: GPU tests matching GPU_TEST_FILTER and benchmark shapes GPU_SHAPES
#   gpu-serve   the serving-batch shapes alone: the batch kernel's tests, gpu_bench, cuBLAS and the peers on them
#   gpu-ncu     a full Nsight Compute profile of one kernel on one shape (NCU_SHAPE, NCU_KERNEL)
#   gpu-clock   the SM clock and power each memory-bound kernel and its copy-only twin run at: nvidia-smi sampled
#               while gpu_bench's kernel rows run long (CLOCK_SHAPES), and Nsight Compute per kernel (CLOCK_NCU)
#   gpu-visual  the long-query wgmma kernel: its tests, visual and q128 packed and from dense device tensors
#               against .carry/base-prebuilt.tar.xz and settings variants, cuBLAS, and profiles of both calls
#   gpu-mem     the memory-bound shapes: ring tests, the read ceilings (read_bw.cu variants), kernel rows, the peers
#   gpu-schedule the memory-bound shapes' kernel rows beside the best plain read of their bytes and the copy-only
#               twins of the ring and the grid (benchmarks/gpu/schedule_read.cu), as built and with the ring forced
#   gpu-coop-rule the grid's selection rule at its boundaries: kernel rows of one-query shapes around 48 pairs per SM
#               and 512-token documents (and 16-row queries, dim 64), as built, with the ring and with the grid forced
#   gpu-api     the public API's overhead: the GPU suite, then gpu_bench's kernel, step and API rows of the
#               one-query shapes, against .carry/base-prebuilt.tar.xz (another build's binaries) when present,
#               and api_floor_probe (the floors of such a call in plain CUDA)
#   gpu-trace   timelines of the public calls (CUPTI: benchmarks/gpu/cupti_trace.cc) from gpu_bench and from Python,
#               traced and clean, with the GPU's clocks sampled; trace_report.py says where each call's time goes
#   gpu-ab      the GPU benchmark of .carry/base-src (MAXSIM_BASE_REV=<rev> make-carry.sh) against this tree
#   gpu-train   the training step: backward tests, gpu_bench's train rows against .carry/base-prebuilt.tar.xz
#               and variants (GPU_TRAIN_VARIANTS), alternated, and each kernel's duration (Nsight Compute)
#   x86-kernels the x86 kernel developers' section: kernel_bench per kernel, top-k pruning, pinned thread scaling
#   py-cuda     the Python package on CUDA tensors: offline `pip install .` from .whl/ (scripts/make-py-wheels.sh;
#               carry .whl too), python/tests/test_cuda.py against the plugin (and PyLate's CUDA path)
# Full logs and JSON go under $OUT, bundled section by section into $OUT/results.tar.gz (a remote runner may
# return only a few files); the summaries of all sections are printed last and kept in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
source scripts/device/env.sh
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(build cpu-tests cpu-bench gpu-tests gpu-bench)
export DEVICE_RUN_SECTIONS="${sections[*]}"  # named in result files' commands
# A remote runner may return only a few files, and only what is under $OUT when the call ends, also when it runs
# past its time limit. So after every section its files go into one archive, $OUT/results.tar (summary-*.txt stay
# until the end), and the summaries so far are rewritten to $OUT/summary.txt: a call cut off mid-way still
# returns the finished sections whole.
bundle() {
  local list
  list=$(cd "$OUT" && find . -mindepth 1 -type f ! -name results.tar ! -name summary.txt ! -name 'summary-*.txt')
  [ -n "$list" ] && (cd "$OUT" && echo "$list" | tar -rf results.tar -T - && echo "$list" | xargs rm -f)
  find "$OUT" -mindepth 1 -type d -empty -delete
  for s in "${sections[@]}"; do
    [ -f "$OUT/summary-$s.txt" ] && { echo "--- $s"; cat "$OUT/summary-$s.txt"; }
  done > "$OUT/summary.txt"
}
status=0
for s in "${sections[@]}"; do
  f=scripts/device/$s.sh
  if [ ! -f "$f" ]; then echo "device-run: no section '$s' ($f)"; status=1; continue; fi
  echo "=== $s ==="
  start=$(date +%s)
  if bash "$f" > "$OUT/$s.log" 2>&1; then r=ok; else r="FAILED (rc $?)"; status=1; fi
  echo "=== $s: $r in $(( $(date +%s) - start )) s (log: $s.log) ==="
  [ "$r" != ok ] && tail -n 40 "$OUT/$s.log"
  bundle
done
echo
echo "################ summary ################"
cat "$OUT/summary.txt"
(cd "$OUT" && ls summary-*.txt > /dev/null 2>&1 && tar -rf results.tar summary-*.txt && rm -f summary-*.txt)
gzip -f "$OUT/results.tar"
exit $status
