# SPDX-License-Identifier: Apache-2.0
"""Where the Python binding's time goes on CUDA tensors (a machine with an NVIDIA GPU, torch and the CUDA plugin:
MAXSIM_PLUGIN_PATH). Per case, the median wall time of one call with a synchronisation after it, beside the same
call's GPU time (PyTorch profiler: its kernels, copies and memsets), and with --profile the binding's functions by
their own time (cProfile over the timed calls, which then also slows the wall times it reports), so that the host
work over the GPU's can be read function by function:

  scores-1k     maxsim.scores(Q, D): one 32-token query against 1000 documents of 300 tokens (textual-1k)
  scores-10     the same against 10 documents (a small call: its GPU time, as measured, is no smaller than
                scores-1k's on an H100, so it is not the binding's overhead alone)
  scores-10-ordered  the same with stream_ordered=True
  train-64      maxsim.torch.maxsim(Q, D) forward + autograd backward, 64 queries x 32 against 64 documents x 300
                (peers.py's train-inbatch), atomic (deterministic=False)

    python python/benchmarks/bench_cuda_overhead.py [--profile] [--calls N] [--out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", action="store_true", help="cProfile the timed calls; print the top functions")
    ap.add_argument("--pieces", action="store_true", help="also time the pieces of a call one by one")
    ap.add_argument("--train", action="store_true", help="also the training step's phases and its host timeline")
    ap.add_argument("--out", default=None, help="write the medians (JSON) here")
    args = ap.parse_args()
    import torch

    import maxsim
    import maxsim.torch as mtorch

    dev = torch.device("cuda")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)

    def unit(shape):
        x = torch.randn(*shape, device=dev, generator=gen)
        return (x / x.norm(dim=-1, keepdim=True)).to(torch.bfloat16)

    q = unit((1, 32, 128))
    d1k, d10 = unit((1000, 300, 128)), unit((10, 300, 128))
    tq = unit((64, 32, 128)).requires_grad_(True)
    td = unit((64, 300, 128)).requires_grad_(True)
    grad = torch.randn(64, 64, device=dev, generator=gen)

    def train():
        s = mtorch.maxsim(tq, td, deterministic=False)
        s.backward(grad)

    cases = {
        "scores-1k": lambda: maxsim.scores(q, d1k),
        "scores-10": lambda: maxsim.scores(q, d10),
        "scores-10-ordered": lambda: maxsim.scores(q, d10, stream_ordered=True),
        "train-64": train,
    }
    print("maxsim", maxsim.__version__, "from", os.path.dirname(maxsim.__file__), "on", torch.cuda.get_device_name())
    print("backend for CUDA tensors:", maxsim.info(backend="cuda")["backend"])
    rows = []
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        wall = []
        prof = cProfile.Profile() if args.profile else None
        for _ in range(args.calls):
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            fn()
            torch.cuda.synchronize()
            if prof:
                prof.disable()
            wall.append((time.perf_counter() - t0) * 1e6)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        kern = sum(e.self_device_time_total for e in p.key_averages()) / 20
        row = {"case": name, "wall_us": statistics.median(wall), "kernels_us": kern}
        rows.append(row)
        print(f"== {name}: wall {row['wall_us']:.1f} us per call (median of {args.calls}), GPU kernels "
              f"{kern:.1f} us")
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
            print("\n".join(l for l in s.getvalue().splitlines() if l.strip())[:6000])
    if args.pieces:
        rows += pieces(torch, maxsim, mtorch, q, d1k, tq, td, grad)
    if args.train:
        rows += train_phases(torch, maxsim, mtorch, tq, td, grad)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


def pieces(torch, maxsim, mtorch, q, d1k, tq, td, grad):
    """The binding's steps one by one (us per call, median of rounds of 200 calls each)."""
    from maxsim import _api, _core
    dev = q.device

    def per_call(fn, n=200, rounds=9):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t.append((time.perf_counter() - t0) * 1e6 / n)
        torch.cuda.synchronize()
        return statistics.median(t)

    qd = q.detach()
    stream = torch.cuda.current_stream(dev).cuda_stream
    qs, ds = _api._side(q, None, "queries"), _api._side(d1k, None, "documents")
    ctx = _api.context(0, None, None, str(dev.index))
    out = torch.empty((1, 1000), dtype=torch.float32, device=dev)
    metric, mode = _api._enum(_api._METRICS, "dot", "metric"), _api._enum(_api._MODES, "exact", "mode")

    def c_call():
        _core.score_matrix(ctx, qs.obj, ds.obj, metric, mode, _api._dl(out), None, False, stream, None, 0)

    ordered = _core.CALL_STREAM_ORDERED
    side_stream = torch.cuda.Stream(device=dev)

    def c_sync_then_sync():
        _core.score_matrix(ctx, qs.obj, ds.obj, metric, mode, _api._dl(out), None, False, stream, None, 0)
        torch.cuda.synchronize()

    def c_ordered_then_sync():
        _core.score_matrix(ctx, qs.obj, ds.obj, metric, mode, _api._dl(out), None, False, stream, None, ordered)
        torch.cuda.synchronize()

    def c_sync_side_stream():
        _core.score_matrix(ctx, qs.obj, ds.obj, metric, mode, _api._dl(out), None, False, side_stream.cuda_stream,
                           None, 0)

    def progress():
        with _api._Progress(False, 1000, "scores", "pairs"):
            pass

    def dev_guard():
        with torch.cuda.device(dev):
            pass

    ql, dl = tq.detach(), td.detach()
    s_arg = _api.scores(ql, dl, return_argmax=True)
    g = grad.float().contiguous()
    cases = {
        "q.__dlpack__()": lambda: qd.__dlpack__(),
        "_core.DenseSets(q)": lambda: _core.DenseSets(qd, None, 0, None, 0),
        "_core.DenseSets(_dl(q)) (torch's C exporter)": lambda: _core.DenseSets(_api._dl(qd), None, 0, None, 0),
        "maxsim.Sets(q)": lambda: maxsim.Sets(q),
        "_side(q)": lambda: _api._side(q, None, "queries"),
        "torch.empty(1 x 1000)": lambda: torch.empty((1, 1000), dtype=torch.float32, device=dev),
        "current_stream().cuda_stream": lambda: torch.cuda.current_stream(dev).cuda_stream,
        "with torch.cuda.device": dev_guard,
        "context() lookup": lambda: _api.context(0, None, None, str(dev.index)),
        "_Progress enter/exit": progress,
        "_core.score_matrix (1k; prebuilt sides, output, context)": c_call,
        "  the same + torch.cuda.synchronize()": c_sync_then_sync,
        "  the same stream-ordered + torch.cuda.synchronize()": c_ordered_then_sync,
        "  the same on a stream torch created (not the legacy default stream)": c_sync_side_stream,
        "torch.cuda.synchronize() alone": torch.cuda.synchronize,
        "maxsim.scores (1k)": lambda: maxsim.scores(q, d1k),
        "train: _api.scores + argmax": lambda: _api.scores(ql, dl, return_argmax=True),
        "train: _api.backward": lambda: _api.backward(ql, dl, s_arg[1], g, deterministic=False),
        "train: forward (autograd)": lambda: mtorch.maxsim(tq, td, deterministic=False),
        "train: fp32 -> bf16 of dD": lambda: torch.empty((64, 300, 128), device=dev).to(torch.bfloat16),
    }
    rows = steps(torch, _api, _core, q, d1k, "scores 1k", False) + steps(torch, _api, _core, ql, dl, "train fwd", True)
    print("== pieces, us per call (calls enqueued back to back, no synchronisation between them):")
    for name, fn in cases.items():
        us = per_call(fn)
        rows.append({"piece": name, "us": us})
        print(f"  {us:8.2f}  {name}")
    return rows


def train_phases(torch, maxsim, mtorch, tq, td, grad, n=300):
    """The autograd training step (train-64) in phases, each followed by torch.cuda.synchronize() (median us), beside
    autograd's own floor (a Function whose forward only allocates its output and whose backward returns zeros), then PyTorch's
    profiler over 20 steps: host ops and CUDA runtime calls by self CPU time."""
    from maxsim import _api

    class Null(torch.autograd.Function):
        @staticmethod
        def forward(ctx, Q, D):
            return torch.empty((Q.shape[0], D.shape[0]), dtype=torch.float32, device=Q.device)

        @staticmethod
        def backward(ctx, g):
            return torch.zeros(tq.shape, dtype=tq.dtype, device=tq.device), torch.zeros(td.shape, dtype=td.dtype,
                                                                                        device=td.device)

    ql, dl = tq.detach(), td.detach()
    a0 = _api.scores(ql, dl, return_argmax=True)[1]
    g = grad.float().contiguous()
    phases = {"forward (maxsim.torch.maxsim)": [], "backward (s.backward)": [], "step": [],
              "autograd floor: Null forward": [], "autograd floor: Null backward": [],
              "_api.scores + argmax": [], "_api.backward": [], "_api.backward stream-ordered": [],
              "dQ, dD fp32 -> bf16": [], "torch.cuda.synchronize() alone": []}
    gq32, gd32 = torch.empty(tq.shape, device=tq.device), torch.empty(td.shape, device=td.device)

    def clock(name, fn):
        t0 = time.perf_counter()
        r = fn()
        torch.cuda.synchronize()
        phases[name].append((time.perf_counter() - t0) * 1e6)
        return r

    for it in range(n + 20):
        s = clock("forward (maxsim.torch.maxsim)", lambda: mtorch.maxsim(tq, td, deterministic=False))
        clock("backward (s.backward)", lambda: s.backward(grad))
        clock("step", lambda: mtorch.maxsim(tq, td, deterministic=False).backward(grad))
        s = clock("autograd floor: Null forward", lambda: Null.apply(tq, td))
        clock("autograd floor: Null backward", lambda: s.backward(grad))
        clock("_api.scores + argmax", lambda: _api.scores(ql, dl, return_argmax=True))
        clock("_api.backward", lambda: _api.backward(ql, dl, a0, g, deterministic=False))
        clock("_api.backward stream-ordered", lambda: _api.backward(ql, dl, a0, g, deterministic=False,
                                                                    stream_ordered=True))
        clock("dQ, dD fp32 -> bf16", lambda: (gq32.to(torch.bfloat16), gd32.to(torch.bfloat16)))
        clock("torch.cuda.synchronize() alone", lambda: None)
        if it < 20:
            for v in phases.values():
                v.clear()
    print(f"== train-64 phases, us (median of {n}; each followed by torch.cuda.synchronize())")
    rows = []
    for name, v in phases.items():
        us = statistics.median(v)
        rows.append({"train_phase": name, "us": us})
        print(f"  {us:8.1f}  {name}")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(20):
            mtorch.maxsim(tq, td, deterministic=False).backward(grad)
            torch.cuda.synchronize()
    print("== train-64 step under PyTorch's profiler (20 steps): by self CPU time")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=28, max_name_column_width=60))
    return rows


def steps(torch, _api, _core, Q, D, label, want_arg, n=300):
    """maxsim.scores' statements (as in _api.py) with a clock between them: us per call for each."""
    names = ["_side x2 + _host_for_packed", "_out_where + _route", "outputs (torch.empty)", "enter guards",
             "context()", "_stream()", "_core.score_matrix", "exit guards", "_to + result"]
    acc = [0.0] * len(names)
    for it in range(n + 20):
        t = [time.perf_counter()]
        q, d, back = _api._host_for_packed(_api._side(Q, None, "queries"), _api._side(D, None, "documents"))
        t.append(time.perf_counter())
        where = _api._out_where(q, d)
        devices = _api._route(q, d, None)
        t.append(time.perf_counter())
        nq, nd = q.obj.n_sets, d.obj.n_sets
        out = _api._empty(where, (nq, nd), "float32")
        arg = _api._empty(where, (nq, nd, q.length), "int32") if want_arg else None
        t.append(time.perf_counter())
        g1, g2 = _api._Progress(False, nq * nd, "scores", "pairs"), _api._on_device(where)
        bar = g1.__enter__()
        g2.__enter__()
        t.append(time.perf_counter())
        ctx = _api.context(0, None, None, devices)
        t.append(time.perf_counter())
        stream = _api._stream(where)
        t.append(time.perf_counter())
        _core.score_matrix(ctx, q.obj, d.obj, 0, 0, _api._dl(out), _api._dl(arg), False, stream, bar, 0)
        t.append(time.perf_counter())
        g2.__exit__(None, None, None)
        g1.__exit__(None, None, None)
        t.append(time.perf_counter())
        out, arg = _api._to(out, back), _api._to(arg, back)
        result = (out, arg) if want_arg else out
        t.append(time.perf_counter())
        if it >= 20:
            for i in range(len(names)):
                acc[i] += t[i + 1] - t[i]
    print(f"== {label}: maxsim.scores' steps, us per call (mean of {n})")
    rows = []
    for name, a in zip(names, acc):
        print(f"  {a * 1e6 / n:8.2f}  {name}")
        rows.append({"step": f"{label}: {name}", "us": a * 1e6 / n})
    print(f"  {sum(acc) * 1e6 / n:8.2f}  total")
    return rows


if __name__ == "__main__":
    main()
