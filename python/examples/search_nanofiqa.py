# SPDX-License-Identifier: Apache-2.0
"""End to end on real ColBERTv2 embeddings (shared/data/colbert-nanofiqa: 35 NanoFiQA documents, 5 queries, the
qrels): pack with the corpus ids, search top 10 in exact / certified / approximate mode, evaluate nDCG@10, then
time top-10 search against growing corpora and save a latency-vs-corpus-size plot (PNG).

No embedding model runs here: no pip package ships ColBERT weights, and nothing can be downloaded at run time,
so the example starts from the shipped embeddings. The larger corpora for the timing are the real documents
plus perturbed copies of their tokens (re-normalised), so that their similarity structure stays ColBERT-like.

    pip install . matplotlib
    python python/examples/search_nanofiqa.py [--data DIR] [--sizes 35,500,2000,4000] [--threads N] [--out latency.png]
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import time

import numpy as np

import maxsim

MODES = ("exact", "certified", "approximate")


def load(data: pathlib.Path):
    tok, off = np.load(data / "docs_tokens.npy"), np.load(data / "docs_offsets.npy")
    qtok, qoff = np.load(data / "queries_tokens.npy"), np.load(data / "queries_offsets.npy")
    docs = [tok[a:b] for a, b in zip(off[:-1], off[1:])]
    queries = qtok.reshape(len(qoff) - 1, -1, qtok.shape[1])  # 5 x 32 x 128 (uniform query length)
    doc_ids = (data / "docs_ids.txt").read_text().split()
    query_ids = (data / "queries_ids.txt").read_text().split()
    qrels: dict[str, dict[str, int]] = {}
    for line in (data / "qrels.tsv").read_text().splitlines()[1:]:
        if line.strip():
            q, d, rel = line.split("\t")
            qrels.setdefault(q, {})[d] = int(rel)
    return docs, queries, doc_ids, query_ids, qrels


def ndcg_at_10(ranked: list[str], rels: dict[str, int]) -> float:
    """nDCG@10 with linear gains (trec_eval's ndcg_cut_10)."""
    dcg = sum(rels.get(d, 0) / math.log2(r + 2) for r, d in enumerate(ranked[:10]))
    ideal = sorted(rels.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def synthetic_corpus(docs: list[np.ndarray], n: int, rng: np.random.Generator) -> list[np.ndarray]:
    out = list(docs)
    while len(out) < n:
        base = docs[len(out) % len(docs)]
        noisy = base + rng.normal(scale=0.05, size=base.shape).astype(np.float32)
        out.append((noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32))
    return out[:n]


def main() -> None:
    here = pathlib.Path(__file__).resolve()
    default_data = pathlib.Path(os.environ.get("MAXSIM_SHARED_DIR", here.parents[3] / "shared")) / "data" / "colbert-nanofiqa"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=default_data)
    ap.add_argument("--sizes", default="35,500,2000,4000", help="corpus sizes for the latency plot")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads per call (0: the library's default)")
    ap.add_argument("--out", default="latency_vs_corpus_size.png")
    args = ap.parse_args()

    docs, queries, doc_ids, query_ids, qrels = load(args.data)
    corpus = maxsim.pack(docs, ids=doc_ids)
    print(f"libmaxsim {maxsim.__version__}, kernel {maxsim.info()['kernel']}; {corpus}")
    for mode in MODES:
        top = maxsim.topk(queries, corpus, 10, mode=mode)
        scores = [ndcg_at_10(top.ids[i], qrels.get(q, {})) for i, q in enumerate(query_ids)]
        print(f"{mode:<12} nDCG@10 = {np.mean(scores):.4f}   (per query: {', '.join(f'{s:.3f}' for s in scores)})")

    rng = np.random.default_rng(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    latency = {m: [] for m in MODES}
    for n in sizes:
        c = maxsim.pack(synthetic_corpus(docs, n, rng))
        for mode in MODES:
            maxsim.topk(queries, c, 10, mode=mode, threads=args.threads)  # warm up
            best = min(_timed(lambda: maxsim.topk(queries, c, 10, mode=mode, threads=args.threads))
                       for _ in range(args.repeats))
            latency[mode].append(best / len(queries) * 1e3)
        print(f"{n:>6} documents: " + ", ".join(f"{m} {latency[m][-1]:.3f} ms/query" for m in MODES))
        c.close()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode, marker in zip(MODES, "osD"):
        ax.plot(sizes, latency[mode], marker=marker, label=mode)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("documents (real NanoFiQA + perturbed copies, ~127 tokens each)")
    ax.set_ylabel("top-10 latency per query (ms)")
    info = maxsim.info(threads=args.threads)
    ax.set_title(f"maxsim.topk, 32-token ColBERTv2 queries, d=128, {info['threads']} thread(s), kernel {info['kernel']}",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
