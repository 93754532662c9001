# SPDX-License-Identifier: Apache-2.0
"""Dense documents in every mode: maxsim.scores of Nq queries (32 tokens each) against 1000 dense documents
(numpy [1000, Ld, 128], unit vectors), exact, certified and approximate, beside certified on the same documents
packed once, for Nq from 1 to 16. Dense certified and approximate quantise every document per call; certified
runs the exact path below 256 query tokens (maxsim.h, "Modes"), and this shows where screening starts to pay.
Rounds are interleaved across the calls of one Nq; reports median and spread per call and the per-round ratio to
dense exact.

    python python/benchmarks/bench_dense_modes.py [--threads N] [--ld 180] [--out FILE]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import maxsim
from common import summary, time_calls, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ld", type=int, default=180)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--queries", default="1,2,4,6,8,12,16")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "dense-modes.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(11)

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    D = unit(rng.standard_normal((1000, args.ld, 128)))
    corpus = maxsim.pack(D)
    t = args.threads
    rows = []
    for nq in (int(x) for x in args.queries.split(",")):
        Q = unit(rng.standard_normal((nq, 32, 128)))
        fns = {
            "dense exact": lambda: maxsim.scores(Q, D, threads=t),
            "dense certified": lambda: maxsim.scores(Q, D, mode="certified", threads=t),
            "dense approximate": lambda: maxsim.scores(Q, D, mode="approximate", threads=t),
            "packed certified": lambda: maxsim.scores(Q, corpus, mode="certified", threads=t),
        }
        exact = fns["dense exact"]()
        assert np.array_equal(fns["dense certified"](), exact) and np.array_equal(fns["packed certified"](), exact)
        per_round = time_calls(fns, min_time=0.3, rounds=args.rounds)
        base = per_round["dense exact"]
        for name, times in per_round.items():
            row = {"shape": f"{nq}x32 vs 1000x{args.ld}, d=128", "query_tokens": nq * 32, "call": name, "threads": t,
                   "time_us": summary(times),
                   "time_vs_dense_exact": summary([a / b for a, b in zip(times, base)], scale=1.0)}
            rows.append(row)
            r = row["time_vs_dense_exact"]
            print(f"{row['shape']:<26} {name:<18} {row['time_us']['median']:11.1f} us  x{r['median']:5.2f} "
                  f"[{r['min']:.2f}-{r['max']:.2f}]", flush=True)
    write_result(args.out, {"benchmark": "dense documents in every mode (maxsim.scores, numpy)",
                            "kernel": maxsim.context(t).kernel, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
