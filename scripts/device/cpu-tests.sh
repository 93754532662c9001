# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
source scripts/device/env.sh
"$BUILD/lib/cli/maxsim" info > "$OUT/maxsim-info.txt" 2>&1 || true
ctest --test-dir "$BUILD" -j"$NPROC" --output-on-failure --timeout 900 2>&1 | tee "$OUT/ctest.txt" | tail -n 30
{ grep -E "tests passed|tests failed" "$OUT/ctest.txt" || echo "ctest printed no result line";
  grep -E "selected|unavailable|available" "$OUT/maxsim-info.txt" | head -20 || true; } > "$OUT/summary-cpu-tests.txt"
