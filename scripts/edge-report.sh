#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Size and dependencies of an edge build (-DMAXSIM_EDGE=ON; scripts/lanes/arm.sh builds one for aarch64 in
# build-arm-edge): the static archive, the statically linked CLI, and every symbol libmaxsim.a needs from outside
# itself (what the final program must link: libc, libm, the C++ runtime). docs/edge.md quotes its output.
#   scripts/edge-report.sh [BUILD_DIR] [TOOL_PREFIX]     defaults: build-arm-edge aarch64-linux-gnu-
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-arm-edge}
tp=${2:-aarch64-linux-gnu-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "edge build: $dir ($(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), ${tp}g++ $(${tp}g++ -dumpversion))"
echo "libmaxsim.a: $(stat -c %s "$dir/libmaxsim.a") bytes"
cp "$dir/lib/cli/maxsim" "$tmp/maxsim" && "${tp}strip" "$tmp/maxsim"
echo "maxsim CLI (static, stripped): $(stat -c %s "$tmp/maxsim") bytes; $("${tp}readelf" -d "$dir/lib/cli/maxsim" | head -2 | tr -s '\n' ' ')"
"${tp}nm" -u "$dir/libmaxsim.a" 2>/dev/null | awk '{print $2}' | sort -u >"$tmp/und"
"${tp}nm" --defined-only "$dir/libmaxsim.a" 2>/dev/null | awk '{print $3}' | sort -u >"$tmp/def"
comm -23 "$tmp/und" "$tmp/def" >"$tmp/ext"
echo "external symbols of libmaxsim.a: $(wc -l <"$tmp/ext")"
echo "  C library / libm: $(grep -v -e '^_Z' -e '^__cxa' -e '^__gxx' -e '^_Unwind' -e '^__dynamic_cast' -e '^__aarch64' -e '^__dso' "$tmp/ext" | tr '\n' ' ')"
echo "  C++ runtime: $(grep -c -e '^_Z' -e '^__cxa' -e '^__gxx' -e '^_Unwind' -e '^__dynamic_cast' "$tmp/ext") symbols (operator new/delete, std::string, exceptions)"
echo "  libgcc atomics: $(grep '^__aarch64' "$tmp/ext" | tr '\n' ' ')"
check() {  # check NAME PATTERN: whether any external symbol matches
  if grep -qE "$2" "$tmp/ext"; then echo "  uses $1"; else echo "  no $1"; fi
}
check "Highway runtime (libhwy)" '^_ZN3hwy'
check "OpenMP runtime" '^(GOMP_|omp_|__kmpc)'
check "dynamic loader (dlopen)" '^dl(open|sym|close|addr)'
check "thread creation" '^pthread_create'
