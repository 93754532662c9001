#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fills .whl/ (git-ignored) with the wheels that the device section py-cuda installs with `pip --no-index` on a
# GPU machine that cannot reach a registry: the build backend (scikit-build-core, nanobind and what they need),
# pytest, and PyLate (no dependencies: its scoring modules import torch and numpy, which that machine has; its
# ranking module also needs `datasets`, which is used there when present). The wheels are pure Python, for the
# machine's CPython (PY_VERSION, default 3.12). Idempotent; a few MB. Pass `.whl` in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
PIP=(python3 -m pip --disable-pip-version-check -q download --only-binary=:all: -d .whl)
mkdir -p .whl
"${PIP[@]}" --python-version "$PY_VERSION" --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 "scikit-build-core>=0.10" "nanobind>=2.0" pytest
"${PIP[@]}" --no-deps "pylate==1.6.0"
ls .whl
