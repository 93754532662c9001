# SPDX-License-Identifier: Apache-2.0
"""The binding against the Python MaxSim implementations users have, on identical data, in one process, at one
thread count: maxsim-cpu (maxsim_scores / maxsim_scores_variable), NumKong (maxsim_packed per document, documents
packed beforehand), and PyLate's CPU scoring (colbert_scores, torch einsum), each where it is installed (pip
install maxsim-cpu numkong pylate). Rounds are interleaved across implementations; reports the median time per
call with its spread, the per-round ratio to maxsim's dense exact call (median and spread), and each result's
largest distance from a float64 reference (NumKong returns sum of (1 - cos): its score is Lq minus that,
valid for the unit vectors used here).

    python python/benchmarks/bench_peers.py --threads 1 [--out FILE]      # run once per thread count
"""

from __future__ import annotations

import argparse
import os
import sys


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer documents (a smoke run)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (median and spread reported)")
    return ap.parse_args()


ARGS = parse()
# Thread pools are sized when a library first starts them: set every knob before importing anything.
for var in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MAXSIM_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import importlib.util  # noqa: E402

import numpy as np  # noqa: E402

import maxsim  # noqa: E402
from common import summary, time_calls, write_result  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import reference_matrix, shared_dir  # noqa: E402


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def shapes(rng: np.random.Generator, n_docs: int) -> list[tuple[str, np.ndarray, list]]:
    out = [("1x32 vs %dx180" % n_docs, unit(rng.standard_normal((32, 128))), list(unit(rng.standard_normal((n_docs, 180, 128))))),
           ("1x32 vs %dx300" % n_docs, unit(rng.standard_normal((32, 128))), list(unit(rng.standard_normal((n_docs, 300, 128))))),
           ("1x32 vs %d x 60-300 (ragged)" % n_docs, unit(rng.standard_normal((32, 128))),
            [unit(rng.standard_normal((int(L), 128))) for L in rng.integers(60, 301, size=n_docs)])]
    base = shared_dir()
    if base is not None:
        d = base / "data" / "colbert-nanofiqa"
        tok, off = np.load(d / "docs_tokens.npy"), np.load(d / "docs_offsets.npy")
        q = np.load(d / "queries_tokens.npy")[:32]
        out.append(("real nanofiqa: 1x32 vs 35 docs", q, [tok[a:b] for a, b in zip(off[:-1], off[1:])]))
    return out


def main() -> None:
    rng = np.random.default_rng(7)
    rows = []
    have = {name: importlib.util.find_spec(name) is not None for name in ("maxsim_cpu", "numkong", "torch", "pylate")}
    versions = {"maxsim": maxsim.__version__}
    for shape, q, docs in shapes(rng, 200 if ARGS.quick else 1000):
        uniform = len({len(d) for d in docs}) == 1
        D3 = np.stack(docs) if uniform else None
        ref = reference_matrix([q], docs)[0]
        corpus = maxsim.pack(docs)
        fns, results = {}, {}

        def add(name, fn, to_scores=lambda r: np.asarray(r, dtype=np.float64)):
            fns[name] = fn
            results[name] = to_scores(fn())

        add("maxsim exact", (lambda: maxsim.scores(q, D3, threads=ARGS.threads)) if uniform else (lambda: maxsim.scores(q, docs, threads=ARGS.threads)))
        add("maxsim exact (packed)", lambda: maxsim.scores(q, corpus, threads=ARGS.threads))
        add("maxsim certified (packed)", lambda: maxsim.scores(q, corpus, mode="certified", threads=ARGS.threads))
        dense = D3 if uniform else docs  # certified runs the exact path here (one query: 32 tokens < 256)
        add("maxsim certified (dense)", lambda: maxsim.scores(q, dense, mode="certified", threads=ARGS.threads))
        add("maxsim approximate (dense)", lambda: maxsim.scores(q, dense, mode="approximate", threads=ARGS.threads))
        if have["maxsim_cpu"]:
            import maxsim_cpu

            versions["maxsim-cpu"] = getattr(maxsim_cpu, "__version__", "installed")
            add("maxsim-cpu", (lambda: maxsim_cpu.maxsim_scores(q, D3)) if uniform else (lambda: maxsim_cpu.maxsim_scores_variable(q, docs)))
        if have["numkong"]:
            import numkong as nk

            versions["numkong"] = getattr(nk, "__version__", "installed")
            qp = nk.maxsim_pack(q)
            dps = [nk.maxsim_pack(d) for d in docs]
            lq = float(len(q))
            add("numkong (maxsim_packed)", lambda: [nk.maxsim_packed(qp, dp) for dp in dps],
                lambda r: lq - np.asarray(r, dtype=np.float64))
        if have["torch"]:
            import torch

            torch.set_num_threads(ARGS.threads)
            versions["torch"] = torch.__version__
            qt = torch.from_numpy(q)[None]
            dt = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(d) for d in docs], batch_first=True)
            mt = torch.nn.utils.rnn.pad_sequence([torch.ones(len(d)) for d in docs], batch_first=True)
            if have["pylate"]:
                from pylate.scores.colbert import colbert_scores
                import pylate

                versions["pylate"] = pylate.__version__
                add("pylate colbert_scores (torch)", lambda: colbert_scores(qt, dt, documents_mask=mt, backend="torch")[0],
                    lambda r: r.double().numpy())
        rounds = time_calls(fns, min_time=0.3, rounds=ARGS.rounds)
        base = rounds["maxsim exact"]
        for name, per_round in rounds.items():
            err = float(np.max(np.abs(results[name] - ref)))
            t = summary(per_round)
            # Per-round ratios to maxsim's dense exact call of the same round (interleaved: load hits both).
            ratio = summary([a / b for a, b in zip(per_round, base)], scale=1.0)
            row = {"shape": shape + ", d=128", "impl": name, "threads": ARGS.threads, "median_us": t["median"],
                   "time_us": t, "time_vs_maxsim_exact": ratio["median"], "time_vs_maxsim_exact_spread": ratio,
                   "max_abs_error_vs_float64": err,
                   "bits_equal_maxsim_exact": bool(np.array_equal(results[name].astype(np.float32), results["maxsim exact"].astype(np.float32)))}
            rows.append(row)
            print(f"{row['shape']:<40} {name:<32} {t['median']:11.1f} us [{t['min']:.0f}-{t['max']:.0f}]  "
                  f"x{ratio['median']:6.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]  err {err:.2e}", flush=True)
    out = ARGS.out or os.path.join(os.path.dirname(__file__), "results", f"peers-t{ARGS.threads}.json")
    write_result(out, {"benchmark": "maxsim vs Python MaxSim peers (one process, same data, same threads)",
                       "threads": ARGS.threads, "versions": versions, "kernel": maxsim.context(ARGS.threads).kernel,
                       "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
