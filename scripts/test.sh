#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test command (README): installs what is missing, builds, and passes the tests.
#   scripts/test.sh                 the release lane (g++ release build + every test, ctest), then the python
#                                   lane (pip install . in a venv + pytest python/tests)
#   scripts/test.sh --LANE [...]    the named lanes instead, in order (each is scripts/lanes/LANE.sh; its first
#                                   comment lines say what it does). --sanitize: clang-19 ASan + UBSan build.
#   scripts/test.sh --list          the lanes this checkout has
# Environment: JOBS (default: number of cores), BUILD_DIR (default: per lane).
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '3,9p' "$0"; exit 0 ;;
    --list) for f in scripts/lanes/*.sh; do n=$(basename "$f" .sh); printf '  --%-12s %s\n' "$n" "$(sed -n '3p' "$f" | sed 's/^# //')"; done; exit 0 ;;
    --*) lane=${arg#--}
         if [ ! -f "scripts/lanes/$lane.sh" ]; then
           echo "test.sh: unknown option '$arg' (scripts/test.sh --list shows the lanes)" >&2; exit 2
         fi
         lanes+=("$lane") ;;
    *) echo "test.sh: unknown argument '$arg' (scripts/test.sh --list shows the lanes)" >&2; exit 2 ;;
  esac
done
[ ${#lanes[@]} -eq 0 ] && lanes=(release python)
bash scripts/setup.sh
# The lanes build the same sources in several folders (build, build-py, build-cuda, ...): ccache, keyed on paths
# relative to this checkout, compiles each source once. A launcher or base folder set by the caller wins.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi
for lane in "${lanes[@]}"; do
  lane_start=$(date +%s)
  echo "test.sh: lane $lane"
  bash "scripts/lanes/$lane.sh"
  echo "test.sh: lane $lane passed in $(( $(date +%s) - lane_start )) s"
done
