# SPDX-License-Identifier: Apache-2.0
"""maxsim.integrations.pylate against PyLate's own functions on the same tensors (real ColBERTv2 embeddings and
adversarial ones). Skipped with a message when PyLate cannot be imported (scripts/lanes/python.sh installs it
with MAXSIM_PY_PYLATE=1)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("pylate.scores", reason="PyLate is not installed (pip install pylate)")

import pylate.rank  # noqa: E402
import pylate.scores  # noqa: E402

import maxsim.integrations.pylate as mp  # noqa: E402


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.delenv("MAXSIM_PYLATE", raising=False)
    monkeypatch.delenv("PYLATE_SCORES_BACKEND", raising=False)
    assert mp.enable()
    yield
    mp.disable()


def padded(real_data):
    docs = [torch.from_numpy(x) for x in real_data["docs"]]
    D = torch.nn.utils.rnn.pad_sequence(docs, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(x)) for x in docs], batch_first=True)
    Q = torch.from_numpy(np.stack(real_data["queries"]))
    return Q, D, mask, docs


def original(name):
    return getattr(pylate.scores.colbert, name).__maxsim_original__


def test_scores_match_pylate_on_real_data(enabled, real_data):
    Q, D, mask, docs = padded(real_data)
    assert hasattr(pylate.scores.colbert_scores, "__maxsim_original__")
    ours = pylate.scores.colbert_scores(Q, D, documents_mask=mask)
    theirs = original("colbert_scores")(Q, D, documents_mask=mask, backend="torch")
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    # Ragged documents (no padding at all) give the same scores.
    torch.testing.assert_close(pylate.scores.colbert_scores(Q, docs), ours, atol=0, rtol=0)
    # The similarity function PyLate's models and losses look up is the patched one.
    fn = pylate.scores.SimilarityFunction.to_similarity_fn("MaxSim")
    assert fn is pylate.scores.colbert_scores
    pairs = pylate.scores.colbert_scores_pairwise(Q, D[:5])
    torch.testing.assert_close(pairs, original("colbert_scores_pairwise")(Q, D[:5], backend="torch"), atol=1e-4, rtol=1e-5)
    kd_docs = D[:20].reshape(5, 4, D.shape[1], 128)
    kd_mask = mask[:20].reshape(5, 4, -1)
    kd = pylate.scores.colbert_kd_scores(Q, kd_docs, documents_mask=kd_mask)
    torch.testing.assert_close(kd, original("colbert_kd_scores")(Q, kd_docs, documents_mask=kd_mask, backend="torch"),
                               atol=1e-4, rtol=1e-5)


def test_rerank_matches_pylate(enabled, real_data):
    Q = [torch.from_numpy(q) for q in real_data["queries"]]
    names = real_data["doc_ids"]
    cand = [[3, 1, 4, 15, 9, 2, 6], [5, 35 - 1, 8], [0], [10, 11, 12, 13], [20, 21]]
    ids = [[names[j] for j in c] for c in cand]
    embs = [[torch.from_numpy(real_data["docs"][j]) for j in c] for c in cand]
    ours = pylate.rank.rerank(ids, Q, embs)
    theirs = pylate.rank.rerank.__maxsim_original__(ids, Q, embs)
    for a, b in zip(ours, theirs):
        assert [r["id"] for r in a] == [r["id"] for r in b]
        np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], atol=1e-4)


def test_autograd_through_patched_scores(enabled, real_data):
    Q0, D0, mask, _ = padded(real_data)
    w = torch.randn(5, 35, generator=torch.Generator().manual_seed(0))
    grads = []
    for fn in (pylate.scores.colbert_scores, lambda *a, **k: original("colbert_scores")(*a, backend="torch", **k)):
        Q, D = Q0.clone().requires_grad_(), D0.clone().requires_grad_()
        (fn(Q, D, documents_mask=mask) * w).sum().backward()
        grads.append((Q.grad, D.grad * mask[..., None]))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-5, rtol=1e-5)
    Q, D = Q0[:2].clone().requires_grad_(), D0[:8].reshape(2, 4, -1, 128).clone().requires_grad_()
    pylate.scores.colbert_kd_scores(Q, D, documents_mask=mask[:8].reshape(2, 4, -1)).sum().backward()
    assert Q.grad is not None and D.grad is not None


def test_masked_tokens_are_excluded_not_zero(enabled):
    # Every real similarity is negative: PyLate's torch path lets the masked (zeroed) position win with 0.
    Q = torch.tensor([[[1.0, 0.0]]])
    D = torch.tensor([[[-1.0, 0.0], [-2.0, 0.0], [5.0, 0.0]]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert pylate.scores.colbert_scores(Q, D, documents_mask=mask).item() == -1.0
    assert original("colbert_scores")(Q, D, documents_mask=mask, backend="torch").item() == 0.0


def test_kill_switch_and_explicit_backend(enabled, monkeypatch):
    Q = torch.tensor([[[1.0, 0.0]]])
    D = torch.tensor([[[-1.0, 0.0], [5.0, 0.0]]])
    mask = torch.tensor([[1.0, 0.0]])
    assert pylate.scores.colbert_scores(Q, D, documents_mask=mask).item() == -1.0
    assert pylate.scores.colbert_scores(Q, D, documents_mask=mask, backend="torch").item() == 0.0
    monkeypatch.setenv("MAXSIM_PYLATE", "0")
    assert pylate.scores.colbert_scores(Q, D, documents_mask=mask).item() == 0.0
    assert mp.enable() is False


def test_disable_restores():
    mp.enable()
    mp.disable()
    assert not hasattr(pylate.scores.colbert_scores, "__maxsim_original__")
    assert not hasattr(pylate.rank.rerank, "__maxsim_original__")
