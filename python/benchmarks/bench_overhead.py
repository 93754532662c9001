# SPDX-License-Identifier: Apache-2.0
"""Per-call overhead of the Python binding over the C call it makes: maxsim.topk(q, corpus, 10) for a 1 x 32
query against a packed corpus (1000 x 180 and 1 x 180 tokens, d = 128, exact and certified), against the same
maxsim_topk call looped in C++ (maxsim._core._time_topk_c_call, no Python in the loop). Goal: under 5 us. Wall
time and the calling thread's CPU time are both reported (with threads=1 the call runs on that thread; on a
loaded machine the CPU time is the steadier measure), as the median and quartiles of per-round differences
(each round of Python calls paired with the C round after it). A numpy query takes maxsim.topk's one-step path;
the same query wrapped in maxsim.Sets takes the general path, measured alongside.

    python python/benchmarks/bench_overhead.py [--threads N] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import maxsim
from common import summary, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
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
            n = 2000 if n_docs == 1 else 20
            calls = {  # what users call: numpy queries (the one-step path), and maxsim.Sets queries (general path)
                "maxsim.topk": lambda: maxsim.topk(q, corpus, 10, mode=mode, threads=args.threads),
                "maxsim.topk (maxsim.Sets query)": lambda: maxsim.topk(qsets, corpus, 10, mode=mode, threads=args.threads),
            }
            wall = {name: [] for name in calls}
            cpu = {name: [] for name in calls}
            c_wall, c_cpu = [], []
            for _ in range(args.rounds):  # interleaved rounds: each Python round is paired with the C round after it
                for name, call in calls.items():
                    w0, c0 = time.perf_counter(), time.thread_time()
                    for _ in range(n):
                        call()
                    wall[name].append((time.perf_counter() - w0) / n)
                    cpu[name].append((time.thread_time() - c0) / n)
                w0, c0 = time.perf_counter(), time.thread_time()
                maxsim._core._time_topk_c_call(ctx, qsets._dense, corpus._packed, 10, m, n)
                c_wall.append((time.perf_counter() - w0) / n)
                c_cpu.append((time.thread_time() - c0) / n)
            for name in calls:
                row = {"shape": f"1x32 vs {n_docs}x180, d=128", "mode": mode, "threads": ctx.threads, "call": name,
                       "python_wall_us": summary(wall[name]), "c_wall_us": summary(c_wall),
                       "overhead_wall_us": summary([a - b for a, b in zip(wall[name], c_wall)]),
                       "python_thread_cpu_us": summary(cpu[name]), "c_thread_cpu_us": summary(c_cpu),
                       "overhead_thread_cpu_us": summary([a - b for a, b in zip(cpu[name], c_cpu)])}
                rows.append(row)
                ow, oc = row["overhead_wall_us"], row["overhead_thread_cpu_us"]
                print(f"{row['shape']:<26} {mode:<10} {name:<32} C {row['c_thread_cpu_us']['median']:10.2f} us; "
                      f"overhead: thread CPU {oc['median']:7.2f} [{oc['p25']:.2f}, {oc['p75']:.2f}] us, "
                      f"wall {ow['median']:8.2f} [{ow['p25']:.2f}, {ow['p75']:.2f}] us", flush=True)
    write_result(args.out, {"benchmark": "python binding overhead (maxsim.topk vs the C call)", "kernel": ctx.kernel,
                            "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
