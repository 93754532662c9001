# SPDX-License-Identifier: Apache-2.0
# The Python package on CUDA tensors (a machine with an NVIDIA GPU and the image's python3 with torch + CUDA; no
# registry). Needs .whl/ from scripts/make-py-wheels.sh (carry [".carry", ".whl"]). Steps, each reported in the
# summary with what failed and why:
#   1. the CUDA plugin (gpu_build: the build section's tree, or .carry/prebuilt.tar.xz; else it is built here);
#   2. the build backend, pytest and PyLate from .whl/ (`pip --no-index` into /tmp/maxsim-py, nothing else of
#      the image changed), then `pip install .` of this checkout (library + extension, CUDA plugin off, the
#      machine's default compiler) into /tmp/maxsim-pkg, as a user installs from source; a failure fails the
#      section. The summary names the compiler, how the extension links the C++ runtime, and the libmaxsim.so
#      the tests load (it must be the package's own: the plugin's build folder leaves the library path first);
#   3. python/tests/test_cuda.py with MAXSIM_PLUGIN_PATH at the plugin and MAXSIM_PY_CUDA_REQUIRE=1 (a missing
#      GPU or plugin fails instead of skipping); its PyLate test runs if pylate.scores and pylate.rank import;
#   4. for information (not the section's result): test_torch.py, test_core.py and test_errors.py there.
# PY_CUDA_TESTS (a pytest -k expression) runs only the matching tests of test_cuda.py, and skips step 4.
# PY_CUDA_INSTALL=prebuilt installs .whl/'s prebuilt maxsim wheel (make-py-wheels.sh) instead of building this
# checkout (the summary names the wheel's revision).
set -uo pipefail
source scripts/device/env.sh
S="$OUT/summary-py-cuda.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
PY=${PYTHON:-python3}
DEPS=/tmp/maxsim-py PKG=/tmp/maxsim-pkg

say "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
say "torch: $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"

# 1. The plugin.
if ! gpu_build maxsim_plugin_cuda > "$OUT/py-cuda-plugin-build.log" 2>&1; then
  say "FAILED: building the CUDA plugin (maxsim_plugin_cuda in $BUILD); log: py-cuda-plugin-build.log"
  tail -n 20 "$OUT/py-cuda-plugin-build.log" >> "$S"
  exit 1
fi
PLUGIN_DIR=${MAXSIM_PLUGIN_PATH:-$BUILD}
if ! ls "$PLUGIN_DIR"/libmaxsim-plugin-cuda.so > /dev/null 2>&1; then
  say "FAILED: no libmaxsim-plugin-cuda.so in $PLUGIN_DIR after gpu_build"
  exit 1
fi
say "plugin: $PLUGIN_DIR/libmaxsim-plugin-cuda.so"
# Prebuilt binaries put their folder, which holds a libmaxsim.so of their own, first on the library path. The
# extension finds the package's libmaxsim.so through its RUNPATH, which the library path overrides: take the
# folder off it, so that the tests run the package's library (the plugin is found through MAXSIM_PLUGIN_PATH).
LD_LIBRARY_PATH=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | grep -v -x -F "$BUILD" | paste -s -d: -)

# 2. Offline install of the build backend and test tools, then of this checkout.
if ! ls .whl/scikit_build_core-*.whl .whl/nanobind-*.whl .whl/pytest-*.whl > /dev/null 2>&1; then
  say "FAILED: .whl/ lacks scikit-build-core, nanobind or pytest wheels: run scripts/make-py-wheels.sh on the preparing machine and pass .whl in carry"
  exit 1
fi
if "$PY" -m pip --version > /dev/null 2>&1; then
  PIP=("$PY" -m pip)
elif ls .whl/pip-*.whl > /dev/null 2>&1; then
  PIP=("$PY" "$(ls .whl/pip-*.whl | tail -n 1)/pip")  # a wheel is a zip that Python runs from
  say "note: $PY has no pip module; pip runs from $(ls .whl/pip-*.whl | tail -n 1)"
else
  say "FAILED: $PY has no pip module and .whl/ has no pip wheel (scripts/make-py-wheels.sh downloads one)"
  exit 1
fi
PIP+=(--disable-pip-version-check --no-cache-dir install --no-index --find-links .whl --no-compile)
rm -rf "$DEPS" "$PKG"
if ! "${PIP[@]}" -q --target "$DEPS" scikit-build-core nanobind pytest > "$OUT/py-cuda-pip.log" 2>&1; then
  say "FAILED: pip --no-index of scikit-build-core, nanobind, pytest from .whl/; log: py-cuda-pip.log"
  tail -n 20 "$OUT/py-cuda-pip.log" >> "$S"
  exit 1
fi
# PyLate, colpali-engine and peft without dependencies, and what PyLate's modules import that the image lacks
# (datasets, dill, multiprocess; make-py-wheels.sh says why), each only where the image lacks it.
for pkg in pylate colpali-engine peft datasets dill multiprocess; do
  module=${pkg//-/_}  # also the wheel's file name prefix
  if ! $PY -c "import $module" > /dev/null 2>&1 && ls .whl/"$module"-*.whl > /dev/null 2>&1; then
    "${PIP[@]}" -q --no-deps --target "$DEPS" "$pkg" >> "$OUT/py-cuda-pip.log" 2>&1 \
      || say "note: $pkg did not install from .whl/ (its test skips)"
  fi
done
export PYTHONPATH="$PKG:$DEPS${PYTHONPATH:+:$PYTHONPATH}"
# This checkout from source, or with PY_CUDA_INSTALL=prebuilt the prebuilt wheel (make-py-wheels.sh).
tag=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
start=$(date +%s)
if [ "${PY_CUDA_INSTALL:-source}" = prebuilt ]; then
  prebuilt=$(ls .whl/maxsim-*-"$tag"-"$tag"-manylinux_*.whl 2> /dev/null | tail -n 1)
  if [ -z "$prebuilt" ]; then
    say "FAILED: PY_CUDA_INSTALL=prebuilt and .whl/ has no prebuilt maxsim wheel for $tag (scripts/make-py-wheels.sh builds one where CPython ${tag#cp} is found)"
    exit 1
  fi
  if ! "${PIP[@]}" -q --no-deps --target "$PKG" "$prebuilt" > "$OUT/py-cuda-install.log" 2>&1; then
    say "FAILED: installing $prebuilt; log: py-cuda-install.log"
    exit 1
  fi
  say "PY_CUDA_INSTALL=prebuilt: installed $(basename "$prebuilt") ($(cat .whl/maxsim-wheel-rev.txt 2> /dev/null || echo "revision unknown")); this checkout is not built here"
else
  cxx=${CXX:-c++}
  say "compiler: $cxx ($(command -v "$cxx" 2> /dev/null), $("$cxx" --version 2> /dev/null | head -n 1))"
  if ! CMAKE_BUILD_PARALLEL_LEVEL=$NPROC "${PIP[@]}" -v --no-build-isolation --no-deps --target "$PKG" . \
       > "$OUT/py-cuda-install.log" 2>&1; then
    say "FAILED: pip install . (offline, this checkout); log: py-cuda-install.log (PY_CUDA_INSTALL=prebuilt installs make-py-wheels.sh's wheel instead)"
    grep -E "error|Error|undefined" "$OUT/py-cuda-install.log" | head -10 >> "$S"
    exit 1
  fi
  say "pip install . (offline, this checkout): $(( $(date +%s) - start )) s"
fi
core=$(ls "$PKG"/maxsim/_core*.so 2> /dev/null | head -n 1)
if readelf -d "$core" 2> /dev/null | grep -q 'NEEDED.*libstdc++'; then
  say "extension: $(basename "$core"), C++ runtime: libstdc++.so (shared)"
else
  say "extension: $(basename "$core"), C++ runtime: linked in statically (the compiler found libstdc++.a first)"
fi
loaded=$(cd python/tests && $PY -c 'import maxsim; print(next(l.split()[-1] for l in open("/proc/self/maps") if "libmaxsim.so" in l))' 2>&1 | tail -n 1)
case $loaded in
  "$PKG"/maxsim/libmaxsim.so*) say "library: $loaded (the package's own)" ;;
  *) say "FAILED: the tests would load $loaded, not $PKG/maxsim's libmaxsim.so"; exit 1 ;;
esac
for mod in pylate.rank colpali_engine.utils.processing_utils; do
  if $PY -c "import $mod" > "$OUT/py-cuda-import.txt" 2>&1; then
    say "${mod%%.*}: imports: its CUDA test runs"
  else
    say "${mod%%.*}: does not import offline ($(tail -n 1 "$OUT/py-cuda-import.txt")): its CUDA test skips"
  fi
done

# 3. The CUDA tests (run from python/tests so that `import maxsim` is the installed package).
export MAXSIM_PLUGIN_PATH="$PLUGIN_DIR" MAXSIM_PY_CUDA_REQUIRE=1 PYTHONUNBUFFERED=1
(cd python/tests && $PY -c "import maxsim, json; i = maxsim.info(backend='cuda'); print(i['report'])") \
  > "$OUT/py-cuda-info.txt" 2>&1
grep -E "^  cuda|^Backend" "$OUT/py-cuda-info.txt" | head -5 >> "$S" || tail -n 3 "$OUT/py-cuda-info.txt" >> "$S"
(cd python/tests && timeout 420 $PY -m pytest -p no:cacheprovider -ra -v test_cuda.py \
  ${PY_CUDA_TESTS:+-k "$PY_CUDA_TESTS"} --junitxml="$OUT/py-cuda-tests.xml") > "$OUT/py-cuda-tests.txt" 2>&1
rc=$?
grep -E "^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped|error)" "$OUT/py-cuda-tests.txt" | tail -n 30 >> "$S"
grep -E "^E  " "$OUT/py-cuda-tests.txt" | head -n 15 >> "$S"
grep -B2 -A25 -E "^_{5,} test" "$OUT/py-cuda-tests.txt" | head -80 >> "$S"
say "test_cuda.py: rc $rc"

# 4. For information: the CPU-side Python tests on this machine's CPU (AVX-512/AMX kernels) with torch there.
[ -n "${PY_CUDA_TESTS:-}" ] && exit $rc
(cd python/tests && timeout 240 $PY -m pytest -p no:cacheprovider -q test_torch.py test_core.py test_errors.py) \
  > "$OUT/py-cuda-cpu-tests.txt" 2>&1
say "for information, test_torch/test_core/test_errors there: rc $? ($(grep -E '[0-9]+ (passed|failed)' "$OUT/py-cuda-cpu-tests.txt" | tail -n 1))"
exit $rc
