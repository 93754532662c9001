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

import functools
import importlib
import os
from typing import Any, Callable, Optional, Union

import torch

from .. import _api
from .._errors import BackendUnavailableError, UnsupportedError
from ..torch import MaxSimFunction

ENV_KILL_SWITCH = "MAXSIM_COLPALI"

# (module, attribute) -> the original object, while enabled.
_originals: dict[tuple[str, str], Any] = {}

_PROCESSOR = ("colpali_engine.utils.processing_utils", "BaseVisualRetrieverProcessor")
_SCORE_SITES = {
    "maxsim_inbatch": ["colpali_engine.utils.maxsim", "colpali_engine.utils.processing_utils",
                       "colpali_engine.loss.late_interaction_losses"],
    "maxsim_kd": ["colpali_engine.utils.maxsim", "colpali_engine.loss.late_interaction_losses"],
}


def _killed() -> bool:
    return os.environ.get(ENV_KILL_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def _explicit_other_backend() -> bool:
    return os.environ.get("COLPALI_SCORES_BACKEND", "auto").strip().lower() in ("torch", "lik")


def _needs_grad(*xs: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _wrap(original: Callable, impl: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _killed() or _explicit_other_backend():
            return original(*args, **kwargs)
        try:
            return impl(*args, **kwargs)
        except (BackendUnavailableError, UnsupportedError):
            # CUDA tensors without a libmaxsim CUDA plugin: colpali-engine's own path.
            return original(*args, **kwargs)

    wrapper.__maxsim_original__ = original  # type: ignore[attr-defined]
    return wrapper


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
    if _killed():
        return False
    module_name, class_name = _PROCESSOR
    cls = getattr(importlib.import_module(module_name), class_name)
    original = cls.__dict__["score_multi_vector"].__func__
    original = getattr(original, "__maxsim_original__", original)
    _originals.setdefault((module_name, class_name + ".score_multi_vector"), cls.__dict__["score_multi_vector"])
    cls.score_multi_vector = staticmethod(_wrap(original, score_multi_vector))
    for name, sites in _SCORE_SITES.items():
        fn = getattr(importlib.import_module("colpali_engine.utils.maxsim"), name)
        fn = getattr(fn, "__maxsim_original__", fn)
        wrapper = _wrap(fn, _IMPLS[name])
        for site in sites:
            try:
                module = importlib.import_module(site)
            except ImportError:
                continue  # a module that needs an optional dependency: nothing to patch there
            if not hasattr(module, name):
                continue
            _originals.setdefault((site, name), getattr(module, name))
            setattr(module, name, wrapper)
    return True


def disable() -> None:
    """Puts colpali-engine's own functions back."""
    for (site, name), original in list(_originals.items()):
        module = importlib.import_module(site)
        if "." in name:
            cls_name, attr = name.split(".", 1)
            setattr(getattr(module, cls_name), attr, original)
        else:
            setattr(module, name, original)
    _originals.clear()


def enabled() -> bool:
    return bool(_originals) and not _killed()
