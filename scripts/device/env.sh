# SPDX-License-Identifier: Apache-2.0
# Sourced by device-run.sh and by every section: where the carried prerequisites are.
C=$PWD/.carry
if [ ! -d "$C/prefix" ]; then
  echo "env.sh: .carry/ is missing: run scripts/make-carry.sh here and pass carry [\".carry\"]" >&2
  exit 1
fi
mkdir -p /tmp/maxsim-blas
[ -f /tmp/maxsim-blas/libdnnl.so.2 ] || tar -xJf "$C/blas.tar.xz" -C /tmp/maxsim-blas
export CMAKE_PREFIX_PATH="$C/prefix"
export MAXSIM_BLAS_DIR=/tmp/maxsim-blas MAXSIM_BLAS_INCLUDE="$C/include-blas"
export LD_LIBRARY_PATH="/tmp/maxsim-blas:$C/prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export MAXSIM_SHARED_DIR="$C/shared"
export BUILD=${BUILD:-$PWD/build-device}

# The command a result file names: this call's sections, after the settings that shaped it (the given
# variable-name pattern, plus MAXSIM_CUDA_ARCHS, MAXSIM_GPU_* and GPU_* knobs) as they were set.
run_command() {
  local pattern=$1 default=$2
  echo "$(env | grep -E "^(${pattern}|MAXSIM_CUDA_ARCHS|MAXSIM_GPU_[A-Z_]+|GPU_[A-Z_]+)=" | sort -u |
    sed -E "s/=(.*)/='\1'/" | tr '\n' ' ')bash scripts/device-run.sh ${DEVICE_RUN_SECTIONS:-$default}"
}

# The first lines of a GPU section's summary, on stdout: the GPU (also kept in $OUT/machine.txt), the binaries
# (their PREBUILT_REV, or the tree they were built from) and the command (run_command PATTERN SECTION).
gpu_summary_head() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader \
    > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
  echo "binaries: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo "built here from $(tree_revision)")"
  echo "command: $(run_command "$1" "$2")"
}

# The revision a result file names: a REVISION file beside the checkout if one was carried; else, when the
# binaries came prebuilt (.carry/prebuilt.tar.xz), the revision they were built from (PREBUILT_REV), since that
# is what ran; else the checkout's own git description (a GPU machine's copy of the tree may carry stale git
# metadata, so prefer the first two).
tree_revision() {
  if [ -f REVISION ]; then
    cat REVISION
  elif [ -f "$BUILD/.prebuilt" ] && [ -f "$BUILD/PREBUILT_REV" ]; then
    echo "$(cut -d' ' -f1 "$BUILD/PREBUILT_REV") (prebuilt binaries)"
  else
    git describe --always --dirty 2> /dev/null || echo unknown
  fi
}
export NPROC=$(nproc)

# The base build of a same-call A/B: .carry/base-prebuilt.tar.xz (another revision's binaries, packed like
# make-carry's prebuilt archive, its PREBUILT_REV inside) unpacked into /tmp/maxsim-base, its revision in BASE_REV.
# False when no base was carried, or (saying so) when it does not unpack. Either way a /tmp/maxsim-base left by an
# earlier call on a warm machine is gone, so a section may test for the folder.
base_build() {
  rm -rf /tmp/maxsim-base
  [ -f "$C/base-prebuilt.tar.xz" ] || return 1
  mkdir -p /tmp/maxsim-base
  if ! tar -xJf "$C/base-prebuilt.tar.xz" -C /tmp/maxsim-base; then
    echo "base_build: .carry/base-prebuilt.tar.xz does not unpack; no base side" >&2
    rm -rf /tmp/maxsim-base
    return 1
  fi
  BASE_REV=$(cat /tmp/maxsim-base/PREBUILT_REV 2> /dev/null)
}

# The Triton peers' wheels carried in .whl/ (late-interaction-kernels, flash-maxsim), installed for this
# process and its children (PYTHONPATH); the install's output goes to $OUT/peers-install.txt.
peer_wheels() {
  ls .whl/*.whl > /dev/null 2>&1 || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/maxsim-peers .whl/*.whl \
    > "$OUT/peers-install.txt" 2>&1 && export PYTHONPATH=/tmp/maxsim-peers${PYTHONPATH:+:$PYTHONPATH}
}

# Configures $BUILD for the GPU sections (Release, CUDA required) unless a configured tree is already there.
# MAXSIM_CUDA_ARCHS (e.g. 90a-real) builds the plugin for those architectures only: a third of the compile time.
configure_gpu_build() {
  [ -f "$BUILD/build.ninja" ] && return 0
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=ON \
    ${MAXSIM_CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$MAXSIM_CUDA_ARCHS} \
    -DMAXSIM_BLAS_DIR="$MAXSIM_BLAS_DIR" -DMAXSIM_BLAS_INCLUDE="$MAXSIM_BLAS_INCLUDE"
}

# Builds the named targets for a GPU section, or, when .carry/prebuilt.tar.xz is there (MAXSIM_PREBUILT=<build
# dir> scripts/make-carry.sh: binaries built on the preparing machine, whose glibc and libstdc++ must be no newer than
# the GPU machine's), unpacks those instead: a quick iteration then spends its GPU time running, not compiling.
# The targets are not checked against the archive: a section that needs a binary the archive lacks fails when it
# runs it.
gpu_build() {
  if [ -f "$C/prebuilt.tar.xz" ]; then
    if [ ! -f "$BUILD/.prebuilt" ]; then
      mkdir -p "$BUILD" && tar -xJf "$C/prebuilt.tar.xz" -C "$BUILD" || return 1
      touch "$BUILD/.prebuilt"
    fi
    echo "gpu_build: prebuilt binaries: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null)"
    local cudart
    cudart=$(dirname "$(command -v nvcc 2> /dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
    export LD_LIBRARY_PATH="$BUILD:$cudart:$LD_LIBRARY_PATH"
    export MAXSIM_PLUGIN_PATH="$BUILD"  # the suite's compiled-in plugin path is the preparing machine's
    return 0
  fi
  configure_gpu_build || return 1
  ninja -C "$BUILD" -j"$NPROC" "$@"
}
