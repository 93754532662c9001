# SPDX-License-Identifier: Apache-2.0
"""libmaxsim as PyLate's ColBERT scoring backend, installed by an explicit call:

    import maxsim.integrations.pylate
    maxsim.integrations.pylate.enable()      # PyLate's colbert_scores & co. now run on libmaxsim
    maxsim.integrations.pylate.disable()     # PyLate's own functions again

Nothing happens at import. ``MAXSIM_PYLATE=0`` in the environment is a kill switch: enable() then installs
nothing and returns False, and wrappers already installed hand every call to PyLate's original function.

What changes: ``pylate.scores.colbert_scores``, ``colbert_scores_pairwise`` and ``colbert_kd_scores`` (where
PyLate's modules reference them: scores, similarity functions, evaluators, ranking) and ``pylate.rank.rerank``
run on libmaxsim, exact, with autograd (the library's backward) when an input requires a gradient. Two things
differ from PyLate's own torch path, on purpose:

- A masked document token is excluded from the max (libmaxsim's rule). PyLate's torch path multiplies the
  similarities by the mask, so a masked token scores 0 and wins whenever every real similarity of a query token is
  negative (ColBERT issue #62); on such inputs the scores differ, elsewhere they agree to float32 rounding.
- ``rerank`` scores each candidate document's own tokens (ragged) instead of zero-padding them to a common length
  (the zero rows are real tokens to PyLate's colbert_scores, with the effect above).

Calls PyLate routes elsewhere stay PyLate's: an explicit ``backend="torch" | "flash" | "lik"`` argument or
``PYLATE_SCORES_BACKEND``, CUDA tensors when no libmaxsim CUDA plugin is available, and the cosine/XTR scores.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable

import torch

from .. import _api
from ..torch import MaxSimFunction
from ._patching import Patches, killed, unwrapped, wrap

ENV_KILL_SWITCH = "MAXSIM_PYLATE"

_patches = Patches()

_SCORE_SITES = {
    "colbert_scores": ["pylate.scores.colbert", "pylate.scores", "pylate.scores.similarity_functions", "pylate.rank.rank"],
    "colbert_scores_pairwise": ["pylate.scores.colbert", "pylate.scores", "pylate.scores.similarity_functions",
                                "pylate.evaluation.colbert_triplet"],
    "colbert_kd_scores": ["pylate.scores.colbert", "pylate.scores", "pylate.evaluation.colbert_distillation"],
    "rerank": ["pylate.rank.rank", "pylate.rank"],
}


def _killed() -> bool:
    return killed(ENV_KILL_SWITCH)


def _explicit_other_backend(backend: Any) -> bool:
    chosen = backend if backend is not None else os.environ.get("PYLATE_SCORES_BACKEND")
    return chosen is not None and str(chosen).lower() in ("torch", "flash", "lik")


def _tensor(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, torch.Tensor) for t in x):
        return list(x)
    if isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape"):
        return [torch.as_tensor(t) for t in x]
    return torch.as_tensor(x)


def _needs_grad(*xs: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _out_dtype(x: Any) -> torch.dtype:
    t = x if isinstance(x, torch.Tensor) else x[0]
    return t.dtype if t.dtype.is_floating_point else torch.float32


def _use_original(kwargs: dict) -> bool:
    return _killed() or _explicit_other_backend(kwargs.get("backend"))


def colbert_scores(queries_embeddings: Any, documents_embeddings: Any, queries_mask: Any = None,
                   documents_mask: Any = None) -> torch.Tensor:
    """PyLate's colbert_scores on libmaxsim: [Nq, Nd]."""
    Q, D = _tensor(queries_embeddings), _tensor(documents_embeddings)
    if isinstance(Q, torch.Tensor) and isinstance(D, torch.Tensor) and _needs_grad(Q, D):
        s = MaxSimFunction.apply(Q, D, queries_mask, documents_mask, "matrix", True, 0)
    else:
        s = _api.scores(Q, D, q_mask=queries_mask, d_mask=documents_mask)
    return s.to(_out_dtype(Q))


def colbert_scores_pairwise(queries_embeddings: Any, documents_embeddings: Any) -> torch.Tensor:
    """PyLate's colbert_scores_pairwise on libmaxsim: [B] (query i against document i; ragged lists allowed)."""
    Q, D = _tensor(queries_embeddings), _tensor(documents_embeddings)
    if isinstance(Q, torch.Tensor) and isinstance(D, torch.Tensor) and _needs_grad(Q, D):
        s = MaxSimFunction.apply(Q, D, None, None, "pairs", True, 0)
    else:
        s = _api.pairs(Q, D)
    return s.to(_out_dtype(Q))


def colbert_kd_scores(queries_embeddings: Any, documents_embeddings: Any, queries_mask: Any = None,
                      documents_mask: Any = None) -> torch.Tensor:
    """PyLate's colbert_kd_scores on libmaxsim: Q [Nq, Lq, d], D [Nq, K, Ld, d] -> [Nq, K]."""
    Q, D = _tensor(queries_embeddings), _tensor(documents_embeddings)
    nq, k = D.shape[0], D.shape[1]
    if _needs_grad(Q, D):
        # Pairs of (query i repeated K times, its K candidates): autograd flows through the repeat.
        Qr = Q.repeat_interleave(k, dim=0)
        qm = None if queries_mask is None else queries_mask.repeat_interleave(k, dim=0)
        dm = None if documents_mask is None else documents_mask.reshape(nq * k, -1)
        s = MaxSimFunction.apply(Qr, D.reshape(nq * k, D.shape[2], D.shape[3]), qm, dm, "pairs", True, 0)
        s = s.reshape(nq, k)
    else:
        s = _api.candidates(Q, D, q_mask=queries_mask, d_mask=documents_mask)
    return s.to(_out_dtype(Q))


def rerank(documents_ids: Any, queries_embeddings: Any, documents_embeddings: Any, device: Any = None) -> list:
    """pylate.rank.rerank on libmaxsim: each query's candidates scored on their own tokens (no zero padding),
    sorted by score descending (ties: earlier candidate first)."""
    results: list = []
    if getattr(queries_embeddings, "ndim", None) == 2:  # one query, as PyLate's reshape_embeddings allows
        queries_embeddings = queries_embeddings[None]
    for qid_list, q, docs in zip(documents_ids, queries_embeddings, documents_embeddings):
        q = torch.as_tensor(q) if not isinstance(q, torch.Tensor) else q
        if device is not None:
            q = q.to(device)
        docs = [torch.as_tensor(d).to(q.device) if not isinstance(d, torch.Tensor) else d.to(q.device) for d in docs]
        if len(docs) == 0:
            results.append([])
            continue
        if q.ndim == 3:  # PyLate accepts [1, Lq, d] per query
            q = q[0]
        s = _api.scores(q, docs).detach().to("cpu", torch.float32)
        order = sorted(range(len(docs)), key=lambda j: (-float(s[j]), j))
        results.append([{"id": qid_list[j], "score": float(s[j])} for j in order])
    return results


_IMPLS: dict[str, Callable[..., Any]] = {"colbert_scores": colbert_scores, "colbert_scores_pairwise": colbert_scores_pairwise,
          "colbert_kd_scores": colbert_kd_scores, "rerank": rerank}


def enable() -> bool:
    """Routes PyLate's ColBERT scoring and reranking through libmaxsim. Returns False (and changes nothing)
    when MAXSIM_PYLATE=0; raises ImportError when PyLate is not installed. Idempotent."""
    if _killed():
        return False
    importlib.import_module("pylate.scores")
    for name, sites in _SCORE_SITES.items():
        home = importlib.import_module("pylate.scores.colbert" if name != "rerank" else "pylate.rank.rank")
        wrapper = wrap(unwrapped(getattr(home, name)), _IMPLS[name], _use_original, drop=("backend",))
        _patches.set_where_present(sites, name, wrapper)
    return True


def disable() -> None:
    """Puts PyLate's own functions back."""
    _patches.restore()


def enabled() -> bool:
    return bool(_patches) and not _killed()
