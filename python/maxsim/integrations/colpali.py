# SPDX-License-Identifier: Apache-2.0
"""libmaxsim as colpali-engine's multi-vector scoring, installed by an explicit call:

    import maxsim.integrations.colpali
    maxsim.integrations.colpali.enable()     # processor.score_multi_vector & co. now run on libmaxsim
    maxsim.integrations.colpali.disable()    # colpali-engine's own functions again

Nothing happens at import. ``MAXSIM_COLPALI=0`` in the environment is a kill switch: enable() then installs
nothing and returns False, and wrappers already installed hand every call to colpali-engine's original.

What changes:

- ``BaseVisualRetrieverProcessor.score_multi_vector`` (the static method every ColPali/ColQwen/ColIdefics
  processor's ``score`` calls): libmaxsim's exact scores, [n_queries, n_passages] float32 on the CPU as
  colpali-engine returns them. The tensors are scored where they are (CPU, or CUDA through the libmaxsim CUDA
  plugin; ``device=`` moves them there first); ``batch_size`` is accepted and not needed (the library bounds its
  own memory). Ragged lists are scored on each passage's own tokens: colpali-engine pads each batch of passages
  with zero rows, which are real tokens to its einsum, so a zero row scores 0 and wins for a query token whose
  similarities are all negative (the padding depends on which passages share a batch). On such inputs the
  scores differ; elsewhere they agree to float32 rounding. A padded [n, L, d] tensor is scored as given (its
  zero rows are tokens, as in colpali-engine).
- ``colpali_engine.utils.maxsim.maxsim_inbatch`` and ``maxsim_kd`` (the losses' hard-max scores, where
  colpali-engine's modules reference them): the same zero-padded tensors without a mask, as colpali-engine
  defines them, with autograd through the library's backward when an input requires a gradient.

Calls colpali-engine routes elsewhere stay its own: ``COLPALI_SCORES_BACKEND=torch`` or ``lik``, and CUDA
tensors when no libmaxsim CUDA plugin is available.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional, Union

import torch

from .. import _api
from ..torch import MaxSimFunction
from ._patching import Patches, killed, unwrapped, wrap

ENV_KILL_SWITCH = "MAXSIM_COLPALI"

_patches = Patches()

_PROCESSOR = ("colpali_engine.utils.processing_utils", "BaseVisualRetrieverProcessor")
_SCORE_SITES = {
    "maxsim_inbatch": ["colpali_engine.utils.maxsim", "colpali_engine.utils.processing_utils",
                       "colpali_engine.loss.late_interaction_losses"],
    "maxsim_kd": ["colpali_engine.utils.maxsim", "colpali_engine.loss.late_interaction_losses"],
}


def _use_original(kwargs: dict) -> bool:
    return killed(ENV_KILL_SWITCH) or \
        os.environ.get("COLPALI_SCORES_BACKEND", "auto").strip().lower() in ("torch", "lik")


def _needs_grad(*xs: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _side(x: Any, device: Optional[torch.device]) -> Any:
    """A [n, L, d] tensor as given, or a list of [L_i, d] tensors (ragged: each scored on its own tokens)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return x if device is None else x.to(device)
    parts = [torch.as_tensor(t).detach() for t in x]
    return [p if device is None else p.to(device) for p in parts]


def score_multi_vector(qs: Union[torch.Tensor, list], ps: Union[torch.Tensor, list], batch_size: int = 128,
                       device: Optional[Union[str, torch.device]] = None) -> torch.Tensor:
    """colpali-engine's ``score_multi_vector`` on libmaxsim: [n_queries, n_passages] float32 on the CPU."""
    if len(qs) == 0:
        raise ValueError("No queries provided")
    if len(ps) == 0:
        raise ValueError("No passages provided")
    dev = None if device is None else torch.device(device)
    s = _api.scores(_side(qs, dev), _side(ps, dev))
    assert s.shape[0] == len(qs), f"Expected {len(qs)} scores, got {s.shape[0]}"
    return s.to("cpu", torch.float32)


def maxsim_inbatch(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """colpali-engine's in-batch MaxSim on libmaxsim: [B_q, B_d] from zero-padded [B_q, L_q, d], [B_d, L_d, d]."""
    if _needs_grad(query, doc):
        s = MaxSimFunction.apply(query, doc, None, None, "matrix", True, 0)
    else:
        s = _api.scores(query.detach(), doc.detach())
    return s.to(torch.promote_types(query.dtype, doc.dtype))


def maxsim_kd(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """colpali-engine's per-query candidate MaxSim on libmaxsim: [B, N] from query [B, L_q, d], doc [B, N, L_d, d]."""
    b, n = doc.shape[0], doc.shape[1]
    if _needs_grad(query, doc):
        # Pairs of (query i repeated N times, its N candidates): autograd flows through the repeat.
        s = MaxSimFunction.apply(query.repeat_interleave(n, dim=0), doc.reshape(b * n, doc.shape[2], doc.shape[3]),
                                 None, None, "pairs", True, 0).reshape(b, n)
    else:
        s = _api.candidates(query.detach(), doc.detach())
    return s.to(torch.promote_types(query.dtype, doc.dtype))


_IMPLS = {"maxsim_inbatch": maxsim_inbatch, "maxsim_kd": maxsim_kd}


def enable() -> bool:
    """Routes colpali-engine's multi-vector scoring through libmaxsim. Returns False (and changes nothing) when
    MAXSIM_COLPALI=0; raises ImportError when colpali-engine is not installed. Idempotent."""
    if killed(ENV_KILL_SWITCH):
        return False
    module_name, class_name = _PROCESSOR
    cls = getattr(importlib.import_module(module_name), class_name)
    original = unwrapped(cls.__dict__["score_multi_vector"].__func__)
    _patches.set(module_name, class_name + ".score_multi_vector",
                 staticmethod(wrap(original, score_multi_vector, _use_original)))
    home = importlib.import_module("colpali_engine.utils.maxsim")
    for name, sites in _SCORE_SITES.items():
        _patches.set_where_present(sites, name, wrap(unwrapped(getattr(home, name)), _IMPLS[name], _use_original))
    return True


def disable() -> None:
    """Puts colpali-engine's own functions back."""
    _patches.restore()


def enabled() -> bool:
    return bool(_patches) and not killed(ENV_KILL_SWITCH)
