# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
source scripts/device/env.sh
{ lscpu; echo; nvidia-smi || true; nvcc --version || true; g++ --version | head -1; cmake --version | head -1; } > "$OUT/machine.txt" 2>&1
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=ON \
  -DMAXSIM_BLAS_DIR="$MAXSIM_BLAS_DIR" -DMAXSIM_BLAS_INCLUDE="$MAXSIM_BLAS_INCLUDE"
ninja -C "$BUILD" -j"$NPROC"
{ echo "built in $BUILD with $(g++ --version | head -1)"; grep -m1 "Model name" "$OUT/machine.txt";
  grep -o -w -E "avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_int8|amx_bf16|avx_vnni" "$OUT/machine.txt" | sort -u | tr '\n' ' '; echo;
  grep -m1 -E "H100|H200" "$OUT/machine.txt" || true; } > "$OUT/summary-build.txt"
