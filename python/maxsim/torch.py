# SPDX-License-Identifier: Apache-2.0
"""PyTorch autograd over libmaxsim: ``maxsim.torch.maxsim(Q, D)`` is a differentiable [Nq, Nd] MaxSim whose
forward is the library's exact scoring (it saves the int32 argmax) and whose backward is the library's backward
(``maxsim_backward``: a gather for dL/dQ, a scatter for dL/dD; deterministic by default, bit-identical across
runs and thread counts on the CPU; on CUDA tensors the CUDA plugin's, atomic when ``deterministic=False``).

The library computes in float32 (inputs f32/f16/bf16). float64 tensors are accepted for gradcheck-style use:
they are rounded to float32 for the forward and the gradients are returned as float64.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import _api


def _lib_dtype(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        t = t.to(torch.float32)
    return t if t.is_contiguous() else t.contiguous()


class MaxSimFunction(torch.autograd.Function):
    """autograd.Function(Q, D, q_mask, d_mask, layout, deterministic, threads, stream_ordered) -> scores."""

    @staticmethod
    def forward(ctx: Any, Q: torch.Tensor, D: torch.Tensor, q_mask: Optional[torch.Tensor],
                d_mask: Optional[torch.Tensor], layout: str, deterministic: bool, threads: int,
                stream_ordered: bool = False) -> torch.Tensor:
        Ql, Dl = _lib_dtype(Q), _lib_dtype(D)
        if layout == "matrix":
            s, argmax = _api.scores(Ql, Dl, q_mask=q_mask, d_mask=d_mask, return_argmax=True, threads=threads,
                                    stream_ordered=stream_ordered)
        elif layout == "pairs":
            s, argmax = _api.pairs(Ql, Dl, q_mask=q_mask, d_mask=d_mask, return_argmax=True, threads=threads,
                                   stream_ordered=stream_ordered)
        else:
            raise _api.InvalidArgumentError(f"layout {layout!r} is not 'matrix' or 'pairs'")
        ctx.save_for_backward(Ql, Dl, argmax)
        ctx.masks = (q_mask, d_mask)
        ctx.options = (layout, deterministic, threads, stream_ordered)
        ctx.dtypes = (Q.dtype, D.dtype)
        return s.to(torch.promote_types(Q.dtype, D.dtype)) if Q.dtype == torch.float64 or D.dtype == torch.float64 else s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        Ql, Dl, argmax = ctx.saved_tensors
        q_mask, d_mask = ctx.masks
        layout, deterministic, threads, stream_ordered = ctx.options
        need_q, need_d = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        rest = (None,) * (len(ctx.needs_input_grad) - 2)  # the options (stream_ordered may be left out)
        if not (need_q or need_d):
            return (None, None) + rest
        g = grad.detach().to(torch.float32).contiguous()
        gq, gd = _api.backward(Ql, Dl, argmax, g, layout=layout, q_mask=q_mask, d_mask=d_mask, need_q=need_q,
                               need_d=need_d, deterministic=deterministic, threads=threads,
                               stream_ordered=stream_ordered)
        gq = None if gq is None else gq.to(ctx.dtypes[0])
        gd = None if gd is None else gd.to(ctx.dtypes[1])
        return (gq, gd) + rest


def maxsim(Q: torch.Tensor, D: torch.Tensor, q_mask: Optional[torch.Tensor] = None,
           d_mask: Optional[torch.Tensor] = None, *, deterministic: bool = True, threads: int = 0,
           stream_ordered: bool = False) -> torch.Tensor:
    """Differentiable in-batch MaxSim: Q [Nq, Lq, d], D [Nd, Ld, d] (masks [Nq, Lq], [Nd, Ld]; 0 = padding)
    -> [Nq, Nd]. Dot metric (the one with a library backward).

    stream_ordered (CUDA tensors): the forward and the backward return without waiting for the GPU, as PyTorch's
    own operations do; a NaN or infinite input then gives NaN scores and gradients, and ``maxsim.synchronize()``
    (or the next library call) raises the error. Off by default: every call then raises its own errors."""
    return MaxSimFunction.apply(Q, D, q_mask, d_mask, "matrix", deterministic, threads, stream_ordered)


def maxsim_pairs(Q: torch.Tensor, D: torch.Tensor, q_mask: Optional[torch.Tensor] = None,
                 d_mask: Optional[torch.Tensor] = None, *, deterministic: bool = True,
                 threads: int = 0, stream_ordered: bool = False) -> torch.Tensor:
    """Differentiable diagonal MaxSim: Q [B, Lq, d], D [B, Ld, d] -> [B] (query i against document i).
    stream_ordered: as for :func:`maxsim`."""
    return MaxSimFunction.apply(Q, D, q_mask, d_mask, "pairs", deterministic, threads, stream_ordered)
