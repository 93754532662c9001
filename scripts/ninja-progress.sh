#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs ninja so that a long build is never silent: each step prints "[done/total percent elapsed]" (NINJA_STATUS),
# and every HEARTBEAT seconds (default 30) a line says what is still compiling and for how long, so a single
# file that takes minutes (the CUDA plugin's nvcc steps) shows up as such rather than as a frozen last line.
#   scripts/ninja-progress.sh BUILD_DIR [ninja arguments: -jN, targets...]
set -euo pipefail
build_dir=$1
shift
HEARTBEAT=${HEARTBEAT:-30}
export NINJA_STATUS=${NINJA_STATUS:-"[%f/%t %p %es] "}
start=$(date +%s)

# The source files the compilers below `root` are working on (ninja -> shell -> compiler driver -> cc1plus/cicc).
compiling() {
  ps -e -o pid=,ppid=,args= 2>/dev/null | awk -v root="$1" '
    { pid[NR] = $1; ppid[NR] = $2; $1 = ""; $2 = ""; args[NR] = $0; n = NR }
    END {
      keep[root] = 1
      for (changed = 1; changed;) {
        changed = 0
        for (i = 1; i <= n; i++) if (keep[ppid[i]] && !keep[pid[i]]) { keep[pid[i]] = 1; changed = 1 }
      }
      for (i = 1; i <= n; i++) {
        if (!keep[pid[i]] || pid[i] == root) continue
        m = split(args[i], a, " ")
        for (j = 1; j <= m; j++) if (a[j] == "-c" && j < m) { f = a[j + 1]; sub(/.*\//, "", f); if (f ~ /\.(c|cc|cpp|cxx|cu)$/) seen[f] = 1 }
      }
      out = ""
      for (f in seen) out = out (out == "" ? "" : ", ") f
      print out
    }'
}

ninja -C "$build_dir" "$@" &
ninja_pid=$!
(
  while sleep "$HEARTBEAT"; do
    kill -0 "$ninja_pid" 2>/dev/null || exit 0
    files=$(compiling "$ninja_pid")
    echo "build: still working after $(( $(date +%s) - start )) s${files:+; compiling $files}"
  done
) &
beat_pid=$!
rc=0
wait "$ninja_pid" || rc=$?
kill "$beat_pid" 2>/dev/null || true
wait "$beat_pid" 2>/dev/null || true
exit "$rc"
