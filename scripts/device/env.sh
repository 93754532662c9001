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
export NPROC=$(nproc)

# Configures $BUILD for the GPU sections (Release, CUDA required) unless a configured tree is already there.
configure_gpu_build() {
  [ -f "$BUILD/build.ninja" ] && return 0
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAXSIM_CUDA=ON \
    -DMAXSIM_BLAS_DIR="$MAXSIM_BLAS_DIR" -DMAXSIM_BLAS_INCLUDE="$MAXSIM_BLAS_INCLUDE"
}
