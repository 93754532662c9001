# SPDX-License-Identifier: Apache-2.0
# The memory-bound shapes (a machine with an NVIDIA GPU): the ring kernel's GPU tests (GPU_TEST_FILTER, default
# the ring and input-check tests), maxsim_gpu_bench (kernel rows) on GPU_SHAPES (default textual-1k, textual-10k,
# colpali-rerank, q128) with the read ceiling (every read_bw.cu variant over 2 GiB, and the fastest over each
# shape's own bytes), the peers on GPU_PEER_SHAPES (default the three ring shapes; one process each, .whl
# carried), and the peers' Triton kernels as compiled in the run (PTX and launch metadata: load widths, cache
# hints, warps, stages). "none" skips the tests, the shapes or the peers. One result file and its tables
# (report.py).
# GPU_MEM_VARIANTS (optional): plugin settings (environment variables read when a backend is created, e.g. a
# kernel switch), space-separated, each VAR=VALUE[,VAR=VALUE...][:shape,shape...] (default shapes GPU_SHAPES):
# each one's tests (GPU_MEM_VARIANT_TESTS, default Gpu.ManyPairs*:Gpu.FoldedInputCheck*) and kernel rows, and its
# libmaxsim peers row (kernel-only; MAXSIM_PEERS_LIB_TAG -vN). With
# .carry/base-prebuilt.tar.xz (another build's binaries, packed like make-carry's prebuilt archive) that build's
# kernel rows too. GPU_MEM_AB_ROUNDS rounds (default 1) alternate base, this build and the variants; a table of
# the exact rows is printed last.
set -uo pipefail
source scripts/device/env.sh
gpu_build maxsim_plugin_cuda maxsim_gpu_tests maxsim_gpu_bench maxsim || exit 1
S="$OUT/summary-gpu-mem.txt"
: > "$S"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader > "$OUT/gpu-machine.txt" 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$OUT/gpu-machine.txt" 2>&1
export MAXSIM_GPU_TESTS_REQUIRE=1
filter=${GPU_TEST_FILTER:-Gpu.ManyPairs*:Gpu.FoldedInputCheck*:Gpu.NonFinite*:Gpu.AdversarialNearTies:Gpu.RealEmbeddings}
trc=0
if [ "$filter" != none ]; then
  timeout 300 "$BUILD/tests/gpu/maxsim_gpu_tests" --gtest_filter="$filter" > "$OUT/gpu-mem-tests.txt" 2>&1
  trc=$?
fi
{ [ -f "$OUT/gpu-mem-tests.txt" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$OUT/gpu-mem-tests.txt"
  echo "gpu tests ($filter): rc $trc"; } >> "$S"
B="$BUILD/benchmarks/gpu/maxsim_gpu_bench"
shapes=${GPU_SHAPES:-textual-1k textual-10k colpali-rerank q128}
brc=0
if [ "$shapes" != none ]; then
  MAXSIM_GPU_BENCH_ROWS=kernel timeout 300 "$B" --only "${shapes// /,}" --json "$OUT/gpu-bench.json" > "$OUT/gpu-bench.txt" 2>&1
  brc=$?
fi
peer_wheels
LIB=$(ls "$BUILD"/libmaxsim.so 2> /dev/null || ls "$BUILD"/libmaxsim.so.* | head -1)
peer_shapes=${GPU_PEER_SHAPES:-textual-1k textual-10k colpali-rerank}
prc=0
if [ "$peer_shapes" != none ]; then
  PYTHONUNBUFFERED=1 timeout 400 python3 benchmarks/gpu/peers.py --lib "$LIB" --json "$OUT/peers.json" \
    --shapes "$peer_shapes" > "$OUT/peers.txt" 2>&1
  prc=$?
fi
# Variants and the base build, alternating round by round (each run a fresh process: settings are read when the
# backend is created).
A="$OUT/gpu-mem-ab.txt"
: > "$A"
read -ra variants <<< "${GPU_MEM_VARIANTS:-}"
i=0
for v in "${variants[@]}"; do
  i=$((i + 1))
  read -ra e <<< "${v%%:*}"; e=(${e[@]//,/ })
  env "${e[@]}" MAXSIM_GPU_TESTS_REQUIRE=1 timeout 200 "$BUILD/tests/gpu/maxsim_gpu_tests" \
    --gtest_filter="${GPU_MEM_VARIANT_TESTS:-Gpu.ManyPairs*:Gpu.FoldedInputCheck*}" > "$OUT/gpu-mem-tests-v$i.txt" 2>&1
  r=$?
  [ $r -eq 0 ] || trc=$r
  echo "v$i $v: tests rc $r ($(grep -cE '^\[       OK' "$OUT/gpu-mem-tests-v$i.txt") passed)" >> "$A"
done
base=""
if base_build; then
  base=/tmp/maxsim-base
  echo "base: $BASE_REV; new: $(cat "$BUILD/PREBUILT_REV" 2> /dev/null || echo built here)" >> "$A"
fi
rounds=${GPU_MEM_AB_ROUNDS:-1}
[ -z "$base" ] && [ ${#variants[@]} -eq 0 ] && rounds=0  # nothing to compare with the rows above
for r in $(seq "$rounds"); do
  sides=(new)
  [ -n "$base" ] && sides=(base new)
  for j in $(seq ${#variants[@]}); do sides+=("v$j"); done
  for side in "${sides[@]}"; do
    dir=$BUILD e=() sh=${shapes// /,}
    if [ "$side" = base ]; then
      dir=$base
    elif [ "$side" != new ]; then
      v=${variants[${side#v} - 1]}
      read -ra e <<< "${v%%:*}"; e=(${e[@]//,/ })
      [[ "$v" == *:* ]] && sh=${v#*:}
    fi
    env "${e[@]}" MAXSIM_GPU_BENCH_ROWS=kernel LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" MAXSIM_PLUGIN_PATH="$dir" \
      timeout 120 "$dir/benchmarks/gpu/maxsim_gpu_bench" --only "$sh" > "$OUT/ab-$side-$r.txt" 2>&1 || brc=1
    grep -E " exact " "$OUT/ab-$side-$r.txt" | sed -E "s|^|round $r $side  |; s/ +[0-9.]+ TFLOP.*sm_mhz\": ([0-9.]+).*/ \1 MHz/" >> "$A"
  done
done
if [ "$peer_shapes" != none ]; then
  for j in $(seq ${#variants[@]}); do
    v=${variants[$j - 1]} sh=$peer_shapes
    read -ra e <<< "${v%%:*}"; e=(${e[@]//,/ })
    [[ "$v" == *:* ]] && sh=${v#*:} && sh=${sh//,/ }
    env "${e[@]}" MAXSIM_PEERS_IMPLS=libmaxsim MAXSIM_PEERS_LIB_TAG=-v$j PYTHONUNBUFFERED=1 timeout 300 \
      python3 benchmarks/gpu/peers.py --lib "$LIB" --json "$OUT/peers-v$j.json" --shapes "$sh" > "$OUT/peers-v$j.txt" 2>&1
    cat "$OUT/peers-v$j.json" >> "$OUT/peers.json"
    grep -E "'kernel_ms'" "$OUT/peers-v$j.txt" | cut -c1-120 | sed "s|^|v$j $v  |" >> "$A"
  done
fi
# The peers' Triton kernels as compiled in this run (Triton's cache): PTX and launch metadata.
tc=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -d "$tc" ]; then
  (cd "$tc" && find . \( -name '*.ptx' -o -name '*.json' \) -print0 | tar --null -T - -czf "$OUT/triton-kernels.tar.gz")
  for f in $(find "$tc" -name '*.ptx'); do
    meta=$(cat "${f%.ptx}.json" 2> /dev/null | grep -o '"num_\(warps\|stages\)": [0-9]*' | tr '\n' ' ')
    echo "$(basename "$f"): $(grep -c 'ld.global' "$f") ld.global ($(grep -o 'ld\.global[.a-zA-Z0-9:_]*' "$f" | sort | uniq -c | tr '\n' ' ')), $(grep -c 'cp.async' "$f") cp.async ($(grep -o 'cp\.async\.[a-z]*\.shared\.global[.a-zA-Z0-9:_]*' "$f" | sort -u | tr '\n' ' ')) $meta"
  done > "$OUT/triton-ptx.txt"
fi
# Local memory in the ring kernels' SASS (spilled or dynamically indexed arrays): listed, not fatal.
if command -v cuobjdump > /dev/null && [ -f "$BUILD/libmaxsim-plugin-cuda.so" ]; then
  cuobjdump -sass "$BUILD/libmaxsim-plugin-cuda.so" 2> /dev/null |
    awk '/Function :/{f=$3} /LDL|STL/{n[f]++} END{for (k in n) print n[k], k}' | sort -rn > "$OUT/sass-local.txt"
fi
python3 benchmarks/gpu/report.py --bench "$OUT/gpu-bench.json" --peers "$OUT/peers.json" --machine "$OUT/gpu-machine.txt" \
  --combine "$OUT/gpu-mem-result.json" \
  --revision "$(tree_revision)" \
  --command "$(run_command 'MAXSIM_PEERS_[A-Z_]+' gpu-mem)" > "$OUT/gpu-mem-report.md" 2>&1
{
  grep -E "^device read|^read variant" "$OUT/gpu-bench.txt"
  grep -E " (exact|read-same-bytes) " "$OUT/gpu-bench.txt" | cut -c1-100
  python3 benchmarks/gpu/report.py --result "$OUT/gpu-mem-result.json" --clock
  grep -E "'kernel_ms'|error" "$OUT/peers.txt" | cut -c1-220
  [ -f "$OUT/triton-ptx.txt" ] && head -n 12 "$OUT/triton-ptx.txt"
  [ -f "$OUT/sass-local.txt" ] && echo "kernels with local memory in SASS: $(wc -l < "$OUT/sass-local.txt") $(grep -c Pipe "$OUT/sass-local.txt") of them ring kernels"
  echo "bench rc $brc, peers rc $prc"
  [ -s "$A" ] && { echo "variants and A/B (exact rows, kernel-only peers rows):"; cat "$A"; }
} >> "$S"
[ $trc -eq 0 ] && [ $brc -eq 0 ]
