#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds .carry/ (git-ignored): the prerequisites that a machine with an NVIDIA GPU may lack, copied from this
# machine's Debian packages, to be copied beside the checkout there. scripts/device-run.sh expects that machine
# to have g++ 13, nvcc, CMake, ninja and PyTorch, and needs neither Debian -dev packages nor network access.
#   .carry/prefix/   Highway, GoogleTest, Google Benchmark headers + libraries + CMake configs (CMAKE_PREFIX_PATH)
#   .carry/blas.tar.xz  oneDNN + OpenBLAS shared libraries and their runtime deps (benchmark baselines)
#   .carry/include-blas/ their headers
#   .carry/shared/   the real ColBERT embeddings from ../shared/data
#   .carry/base-src/ only with MAXSIM_BASE_REV=<git rev>: that revision's sources, for the section gpu-ab
#                    (the GPU benchmark of that revision against the working tree's, alternating, one process
#                    per run)
#   .carry/prebuilt.tar.xz  only with MAXSIM_PREBUILT=<build dir>: that tree's GPU binaries (plugin, library, CLI,
#                    GPU suite, GPU benchmarks), which the GPU sections then run instead of building (env.sh
#                    gpu_build). To iterate quickly: configure the tree with -DMAXSIM_CUDA=ON
#                    -DCMAKE_CUDA_ARCHITECTURES=90a-real (one architecture keeps the archive small, ~10 MB) and
#                    build those targets first; without the variable any earlier archive is removed.
# Idempotent; about 40 s the first time (xz), instant afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
C=.carry
ML=/usr/lib/x86_64-linux-gnu
mkdir -p $C/prefix/include $C/prefix/lib/x86_64-linux-gnu/cmake $C/include-blas
for d in hwy gtest gmock benchmark; do
  [ -d /usr/include/$d ] && { rm -rf $C/prefix/include/$d; cp -a /usr/include/$d $C/prefix/include/; }
done
cp -a $ML/libhwy*.so* $ML/libgtest*.a $ML/libgmock*.a $ML/libbenchmark* $C/prefix/lib/x86_64-linux-gnu/ 2>/dev/null || true
for d in hwy GTest benchmark; do rm -rf $C/prefix/lib/x86_64-linux-gnu/cmake/$d; cp -a $ML/cmake/$d $C/prefix/lib/x86_64-linux-gnu/cmake/; done
rm -rf $C/include-blas/oneapi && cp -a /usr/include/oneapi $C/include-blas/ 2>/dev/null || true
cp -a /usr/include/dnnl*.h* /usr/include/x86_64-linux-gnu/openblas-pthread/*.h $C/include-blas/ 2>/dev/null || true
if [ ! -f $C/blas.tar.xz ]; then
  tmp=$(mktemp -d)
  cp -L $ML/libdnnl.so.2 $ML/openblas-pthread/libopenblas.so.0 $ML/libgfortran.so.5 $ML/libquadmath.so.0 \
        $ML/libOpenCL.so.1 "$tmp"/
  ln -s libdnnl.so.2 "$tmp"/libdnnl.so
  ln -s libopenblas.so.0 "$tmp"/libopenblas.so
  tar -cJf $C/blas.tar.xz -C "$tmp" .
  rm -rf "$tmp"
fi
if [ -d ../shared/data/colbert-nanofiqa ]; then
  mkdir -p $C/shared/data && rm -rf $C/shared/data/colbert-nanofiqa
  cp -a ../shared/data/colbert-nanofiqa $C/shared/data/
fi
rm -rf $C/base-src
if [ -n "${MAXSIM_BASE_REV:-}" ]; then
  mkdir -p $C/base-src
  git archive "$MAXSIM_BASE_REV" | tar -x -C $C/base-src
  echo "$(git rev-parse --short "$MAXSIM_BASE_REV") $(git log -1 --format=%s "$MAXSIM_BASE_REV" | cut -c1-80)" > $C/base-src/REV
fi
rm -f $C/prebuilt.tar.xz
if [ -n "${MAXSIM_PREBUILT:-}" ]; then
  B=$MAXSIM_PREBUILT
  ninja -C "$B" -j2 maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench maxsim_multi_gpu_bench maxsim_cli \
    $(ninja -C "$B" -t targets all 2> /dev/null | grep -oE '^maxsim_(api_floor|launch)_probe:' | tr -d :)
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib plugins packing tests benchmarks || echo +changes)" \
    "built $(date -u +%FT%TZ) in $B" > "$B/PREBUILT_REV"
  (cd "$B" && tar -cf - PREBUILT_REV libmaxsim-plugin-cuda.so libmaxsim.so* lib/cli/maxsim tests/gpu/maxsim_gpu_tests \
     benchmarks/gpu/maxsim_gpu_bench benchmarks/gpu/maxsim_multi_gpu_bench \
     $(ls benchmarks/gpu/maxsim_api_floor_probe benchmarks/gpu/maxsim_launch_probe 2> /dev/null)) | xz -T2 -3 > $C/prebuilt.tar.xz
fi
du -sh $C
