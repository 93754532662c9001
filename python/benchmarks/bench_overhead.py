# SPDX-License-Identifier: Apache-2.0
"""Per-call overhead of the Python binding over the C call it makes: maxsim.topk(q, corpus, 10) for a 1 x 32
query against a packed corpus (1000 x 180 and 1 x 180 tokens, d = 128, exact and certified), against the same
maxsim_topk call looped in C++ (maxsim._core._time_topk_c_call, no Python in the loop). Goal: under 5 us.

    python python/benchmarks/bench_overhead.py [--threads N] [--out FILE]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import maxsim
from common import time_calls, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "overhead.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((32, 128)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ctx = maxsim.context(threads=args.threads)
    qsets = maxsim.Sets(q)
    rows = []
    for n_docs in (1, 1000):
        docs = rng.standard_normal((n_docs, 180, 128)).astype(np.float32)
        docs /= np.linalg.norm(docs, axis=2, keepdims=True)
        corpus = maxsim.pack(docs)
        for mode in ("exact", "certified"):
            m = {"exact": 0, "certified": 1}[mode]
            t = time_calls({
                "python": lambda: maxsim.topk(q, corpus, 10, mode=mode, threads=args.threads),
                "c_loop_1": lambda: maxsim._core._time_topk_c_call(ctx, qsets._dense, corpus._packed, 10, m, 1),
            }, min_time=0.3, rounds=9)
            c = min(maxsim._core._time_topk_c_call(ctx, qsets._dense, corpus._packed, 10, m, 200) for _ in range(9))
            py = t["python"]
            rows.append({"shape": f"1x32 vs {n_docs}x180, d=128", "mode": mode, "threads": ctx.threads,
                         "python_us": py * 1e6, "c_call_us": c * 1e6, "overhead_us": (py - c) * 1e6})
            print(f"{rows[-1]['shape']:<26} {mode:<10} python {py * 1e6:10.2f} us   C {c * 1e6:10.2f} us   "
                  f"overhead {(py - c) * 1e6:7.2f} us")
    write_result(args.out, {"benchmark": "python binding overhead (maxsim.topk vs the C call)", "kernel": ctx.kernel,
                            "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
