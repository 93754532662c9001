# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the float64 reference, random/adversarial generators, and the real ColBERTv2 embeddings
(MAXSIM_SHARED_DIR, else ../shared beside the repository)."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def shared_dir() -> pathlib.Path | None:
    env = os.environ.get("MAXSIM_SHARED_DIR")
    for cand in ([pathlib.Path(env)] if env else []) + [REPO.parent / "shared"]:
        if (cand / "data" / "colbert-nanofiqa" / "docs_tokens.npy").exists():
            return cand
    return None


def reference_matrix(Q, D, q_mask=None, d_mask=None, metric="dot"):
    """float64 MaxSim of ragged lists (lists of [L, d] arrays): scores [Nq, Nd] and argmax lists."""
    out = np.zeros((len(Q), len(D)))
    for i, q in enumerate(Q):
        q = np.asarray(q, dtype=np.float64)
        qm = np.ones(len(q), bool) if q_mask is None else np.asarray(q_mask[i], bool)
        for j, d in enumerate(D):
            d = np.asarray(d, dtype=np.float64)
            dm = np.ones(len(d), bool) if d_mask is None else np.asarray(d_mask[j], bool)
            if not dm.any():
                out[i, j] = -np.inf if len(q) else 0.0
                continue
            sim = q @ d.T
            if metric == "cosine":
                sim = sim / np.maximum(np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(d, axis=1)[None, :], 1e-300)
            sim[:, ~dm] = -np.inf
            out[i, j] = sim.max(axis=1)[qm].sum()
    return out


def tolerance(Q, D):
    """|f32 scoring - float64| bound: f32 dot products (d rounding steps of the running sum) over Lq tokens."""
    lq = max((len(q) for q in Q), default=1)
    d = np.asarray(Q[0]).shape[-1] if len(Q) else 1
    scale = max(float(np.max(np.abs(np.concatenate([np.asarray(x, np.float64).ravel() for x in Q])), initial=1.0)), 1.0)
    dscale = max(float(np.max(np.abs(np.concatenate([np.asarray(x, np.float64).ravel() for x in D])), initial=1.0)), 1.0)
    return 4 * lq * d * scale * dscale * d * 2.0 ** -23 + 1e-6


@pytest.fixture(scope="session")
def real_data():
    base = shared_dir()
    if base is None:
        pytest.skip("real ColBERTv2 data not found (set MAXSIM_SHARED_DIR to the shared/ folder)")
    d = base / "data" / "colbert-nanofiqa"
    docs, doffs = np.load(d / "docs_tokens.npy"), np.load(d / "docs_offsets.npy")
    qs, qoffs = np.load(d / "queries_tokens.npy"), np.load(d / "queries_offsets.npy")
    return {
        "docs": [docs[doffs[i]:doffs[i + 1]] for i in range(len(doffs) - 1)],
        "docs_tokens": docs, "docs_offsets": doffs,
        "queries": [qs[qoffs[i]:qoffs[i + 1]] for i in range(len(qoffs) - 1)],
        "queries_tokens": qs, "queries_offsets": qoffs,
        "doc_ids": (d / "docs_ids.txt").read_text().split(),
        "query_ids": (d / "queries_ids.txt").read_text().split(),
        "qrels": [line.split("\t") for line in (d / "qrels.tsv").read_text().splitlines()[1:] if line.strip()],
    }


def real_batch(real_data):
    """The real embeddings as torch tensors: queries [Nq, 32, 128], documents zero-padded [Nd, L, 128] and their
    [Nd, L] bool mask (True = token)."""
    import torch

    L = max(len(x) for x in real_data["docs"])
    D = torch.zeros(len(real_data["docs"]), L, 128)
    mask = torch.zeros(len(real_data["docs"]), L, dtype=torch.bool)
    for i, x in enumerate(real_data["docs"]):
        D[i, :len(x)] = torch.from_numpy(x)
        mask[i, :len(x)] = True
    return torch.from_numpy(np.stack(real_data["queries"])), D, mask


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
