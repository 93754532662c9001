# SPDX-License-Identifier: Apache-2.0
"""maxsim.integrations.colpali against colpali-engine's own functions on the same tensors (the real ColBERTv2
embeddings, random and adversarial ones). Skipped with a message when colpali-engine cannot be imported
(scripts/lanes/python.sh installs it with MAXSIM_PY_COLPALI=1)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import reference_matrix, tolerance

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("colpali_engine.utils.processing_utils",
                    reason="colpali-engine is not installed (pip install --no-deps colpali-engine pillow peft)")

import colpali_engine.loss.late_interaction_losses as losses  # noqa: E402
import colpali_engine.utils.maxsim as cmaxsim  # noqa: E402
from colpali_engine.models import ColQwen2Processor  # noqa: E402
from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor as Base  # noqa: E402

import maxsim  # noqa: E402
import maxsim.integrations.colpali as mc  # noqa: E402


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.delenv("MAXSIM_COLPALI", raising=False)
    monkeypatch.delenv("COLPALI_SCORES_BACKEND", raising=False)
    assert mc.enable()
    yield
    mc.disable()


def original_score(qs, ps, **kw):
    return Base.score_multi_vector.__maxsim_original__(qs, ps, device="cpu", **kw)


def test_score_multi_vector_matches_colpali_on_real_data(enabled, real_data):
    qs = [torch.from_numpy(q) for q in real_data["queries"]]
    ps = [torch.from_numpy(d) for d in real_data["docs"]]
    ours = Base.score_multi_vector(qs, ps)
    assert ours.dtype == torch.float32 and ours.device.type == "cpu" and ours.shape == (len(qs), len(ps))
    theirs = original_score(qs, ps, batch_size=8)  # several passage batches, each zero-padded
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    # The exact scores: the library's, bit for bit, and within the float32 bound of float64.
    assert torch.equal(ours, maxsim.scores(qs, ps))
    q64, d64 = real_data["queries"], real_data["docs"]
    np.testing.assert_allclose(ours.numpy(), reference_matrix(q64, d64), atol=tolerance(q64, d64), rtol=0)
    # Every processor's score() reaches the patched static method.
    assert hasattr(ColQwen2Processor.score_multi_vector, "__maxsim_original__")
    torch.testing.assert_close(ColQwen2Processor.score_multi_vector(qs[:2], ps[:7]), ours[:2, :7], atol=0, rtol=0)


def test_padded_tensors_and_half_precision(enabled):
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(3, 20, 128, generator=g)
    P = torch.randn(9, 70, 128, generator=g)
    P[4, 50:] = 0.0  # zero padding inside a tensor: tokens that score 0, as colpali-engine scores them
    ours = Base.score_multi_vector(Q, P)
    torch.testing.assert_close(ours, original_score(Q, P), atol=1e-4, rtol=1e-5)
    # bf16 (what ColPali models emit): libmaxsim accumulates in f32, within the f32 bound of float64.
    Qb, Pb = Q.bfloat16(), P.bfloat16()
    s = Base.score_multi_vector(list(Qb), list(Pb))
    q64, d64 = list(Qb.double().numpy()), list(Pb.double().numpy())
    np.testing.assert_allclose(s.numpy(), reference_matrix(q64, d64), atol=tolerance(q64, d64), rtol=0)


def test_ragged_passages_are_not_zero_padded(enabled):
    # All real similarities negative: colpali-engine's zero padding (passage 0 is shorter than passage 1 in the
    # same batch) scores 0 and wins; libmaxsim scores passage 0's own tokens.
    qs = [torch.tensor([[1.0, 0.0]])]
    ps = [torch.tensor([[-1.0, 0.0]]), torch.tensor([[-2.0, 0.0], [-3.0, 0.0]])]
    assert Base.score_multi_vector(qs, ps).tolist() == [[-1.0, -2.0]]
    assert original_score(qs, ps).tolist() == [[0.0, -2.0]]


def test_losses_inbatch_and_kd_with_autograd(enabled):
    g = torch.Generator().manual_seed(1)
    unit = torch.nn.functional.normalize  # ColPali's embeddings are L2-normalised
    Q0 = unit(torch.randn(4, 16, 64, generator=g), dim=-1)
    D0 = unit(torch.randn(4, 40, 64, generator=g), dim=-1)
    N0 = unit(torch.randn(4, 3, 40, 64, generator=g), dim=-1)
    D0[2, 30:] = 0.0  # zero-padded documents, as the losses receive them
    assert losses.maxsim_inbatch is cmaxsim.maxsim_inbatch and hasattr(losses.maxsim_kd, "__maxsim_original__")
    torch.testing.assert_close(cmaxsim.maxsim_inbatch(Q0, D0), cmaxsim._torch_maxsim(Q0, D0), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(cmaxsim.maxsim_kd(Q0, N0), cmaxsim._torch_maxsim_kd(Q0, N0), atol=1e-4, rtol=1e-5)
    grads = []
    for inbatch, kd in ((cmaxsim.maxsim_inbatch, cmaxsim.maxsim_kd), (cmaxsim._torch_maxsim, cmaxsim._torch_maxsim_kd)):
        Q, D, N = (t.clone().requires_grad_() for t in (Q0, D0, N0))
        (inbatch(Q, D).logsumexp(1).sum() + kd(Q, N).square().sum()).backward()
        grads.append((Q.grad, D.grad, N.grad))
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    # A colpali-engine loss end to end: the same loss value and gradients as its own einsum path.
    values = []
    for backend in ("auto", "torch"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("COLPALI_SCORES_BACKEND", backend)
            Q, D = Q0.clone().requires_grad_(), D0.clone().requires_grad_()
            loss = losses.ColbertLoss()(Q, D)
            loss.backward()
            values.append((loss.detach(), Q.grad, D.grad))
    for ours, theirs in zip(*values):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)


def test_kill_switch_backend_variable_and_disable(enabled, monkeypatch):
    qs = [torch.tensor([[1.0, 0.0]])]
    ps = [torch.tensor([[-1.0, 0.0]]), torch.tensor([[-2.0, 0.0], [-3.0, 0.0]])]
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")
    assert Base.score_multi_vector(qs, ps, device="cpu").tolist() == [[0.0, -2.0]]
    monkeypatch.delenv("COLPALI_SCORES_BACKEND")
    monkeypatch.setenv("MAXSIM_COLPALI", "0")
    assert Base.score_multi_vector(qs, ps, device="cpu").tolist() == [[0.0, -2.0]]
    assert mc.enable() is False
    monkeypatch.delenv("MAXSIM_COLPALI")
    assert Base.score_multi_vector(qs, ps).tolist() == [[-1.0, -2.0]]
    with pytest.raises(ValueError, match="No queries"):
        Base.score_multi_vector([], ps)
    mc.disable()
    assert not hasattr(Base.score_multi_vector, "__maxsim_original__")
    assert not hasattr(cmaxsim.maxsim_inbatch, "__maxsim_original__")
    assert not hasattr(losses.maxsim_kd, "__maxsim_original__")
