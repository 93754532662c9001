#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `--python`: the Python package. A venv (reused when present), `pip install .` of this checkout (library +
# nanobind extension through scikit-build-core), mypy on the package's source (pyproject.toml's [tool.mypy], against
# the installed extension's stubs; ~20 s cold, ~1 s with its cache in the venv), then the pytest suite
# python/tests. Always with numpy; the optional groups are off unless asked, because they are large downloads
# (.ci/run turns all of them on):
#   MAXSIM_PY_TORCH=1   PyPI's torch wheel (~3 GB with its CUDA libraries): the autograd and torch-input tests
#   MAXSIM_PY_PYLATE=1  PyLate's scoring modules (with torch): the integration tests against PyLate's functions
#   MAXSIM_PY_RAY=1     Ray: the maxsim.distributed tests
#   MAXSIM_PY_WHEEL=1   after the tests, scripts/py-wheel-check.sh: pip wheel + auditwheel repair (libgomp and
#                       libhwy bundled, manylinux tag) and the repaired wheel alone in a fresh venv (~20 s warm)
#   MAXSIM_PY_COLPALI=1 colpali-engine (with torch) without its dependencies, whose torchvision pin would replace
#                       the venv's torch, plus the two its processing and loss modules import (pillow, peft), torch
#                       held at the venv's version: the integration tests against colpali-engine's functions
# Tests whose package is missing skip, saying so. Environment: MAXSIM_PY_VENV (default ~/.cache/libmaxsim/py-venv),
# PYTHON (default python3), JOBS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh --python
PYTHON=${PYTHON:-python3}
VENV=${MAXSIM_PY_VENV:-$HOME/.cache/libmaxsim/py-venv}
JOBS=${JOBS:-$(nproc)}
if [ ! -x "$VENV/bin/python" ]; then
  echo "test.sh: creating the venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
want=(scikit-build-core nanobind numpy pytest tqdm mypy)
[ "${MAXSIM_PY_TORCH:-0}" = 1 ] && want+=(torch)
[ "${MAXSIM_PY_RAY:-0}" = 1 ] && want+=(ray)
off=()
[ "${MAXSIM_PY_TORCH:-0}" = 1 ] || off+=("torch (MAXSIM_PY_TORCH=1)")
[ "${MAXSIM_PY_PYLATE:-0}" = 1 ] && [ "${MAXSIM_PY_TORCH:-0}" = 1 ] || off+=("PyLate (MAXSIM_PY_TORCH=1 MAXSIM_PY_PYLATE=1)")
[ "${MAXSIM_PY_RAY:-0}" = 1 ] || off+=("Ray (MAXSIM_PY_RAY=1)")
[ "${MAXSIM_PY_COLPALI:-0}" = 1 ] && [ "${MAXSIM_PY_TORCH:-0}" = 1 ] || off+=("colpali-engine (MAXSIM_PY_TORCH=1 MAXSIM_PY_COLPALI=1)")
[ ${#off[@]} -gt 0 ] && echo "test.sh: not installing the optional groups $(IFS=,; echo "${off[*]}" | sed 's/,/, /g'); their tests skip unless the venv already has them"
missing=()
for p in "${want[@]}"; do "$VENV/bin/python" -m pip show -q "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]} into the venv"
  "${PIP[@]}" install "${missing[@]}"
fi
if [ "${MAXSIM_PY_TORCH:-0}" = 1 ] && [ "${MAXSIM_PY_PYLATE:-0}" = 1 ] && \
   ! "$VENV/bin/python" -c "import pylate.scores, pylate.rank" >/dev/null 2>&1; then
  # PyLate's full dependency set (sentence-transformers, fast-plaid, ...) is not needed to import its scoring and
  # ranking modules: install it without dependencies, then what those modules import.
  echo "test.sh: installing pylate (scoring modules) into the venv"
  "${PIP[@]}" install --no-deps pylate && "${PIP[@]}" install "transformers>=4.41,<=5.3" datasets ujson \
    || echo "test.sh: PyLate could not be installed; its integration tests will be skipped"
fi
if [ "${MAXSIM_PY_TORCH:-0}" = 1 ] && [ "${MAXSIM_PY_COLPALI:-0}" = 1 ] && \
   ! "$VENV/bin/python" -c "import colpali_engine.utils.processing_utils" >/dev/null 2>&1; then
  torch_version=$("$VENV/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
  echo "test.sh: installing colpali-engine (no dependencies) + pillow, peft into the venv (torch held at $torch_version)"
  constraints=$(mktemp)
  echo "torch==$torch_version" > "$constraints"
  "${PIP[@]}" install --no-deps "colpali-engine==0.3.18" && "${PIP[@]}" install -c "$constraints" pillow "peft>=0.18,<0.21" \
    || echo "test.sh: colpali-engine could not be installed; its integration tests will be skipped"
  rm -f "$constraints"
fi
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
echo "test.sh: pip install . (build in build-py/)"
CMAKE_ARGS="${CMAKE_ARGS:-} $launcher" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
  "${PIP[@]}" install --no-build-isolation --no-deps --force-reinstall .
echo "test.sh: mypy on python/maxsim"
"$VENV/bin/python" -m mypy --cache-dir "$VENV/mypy-cache"
echo "test.sh: running the Python tests"
(cd python/tests &&  # not the repository root: `import maxsim` must find the installed package, not ./python
 "$VENV/bin/python" -m pytest -q -p no:cacheprovider .)
if [ "${MAXSIM_PY_WHEEL:-0}" = 1 ]; then
  CMAKE_ARGS="${CMAKE_ARGS:-} $launcher" JOBS=$JOBS bash scripts/py-wheel-check.sh "$VENV"
else
  echo "test.sh: the wheel check (auditwheel, fresh venv) is off (MAXSIM_PY_WHEEL=1)"
fi
