#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The public calls that gpu_bench's API rows time, made from Python (ctypes, torch tensors), for a timeline.

    CUDA_INJECTION64_PATH=libmaxsim_cupti_trace.so MAXSIM_TRACE_OUT=t.tsv \\
        python3 benchmarks/gpu/api_timeline.py --lib build/libmaxsim.so --json out.json

Per case: 5 warm-up calls, then --iters calls, each marked on the timeline of benchmarks/gpu/cupti_trace.cc
("py <shape> <case>") when that library is loaded, and each timed with the host clock (the call returns when its
results are ready; nothing else is synchronised). Cases: the score matrix on dense GPU tensors (textual-10k,
visual) on torch's current stream and on a side stream, and the training step (forward with argmax, backward;
forward alone). benchmarks/gpu/trace_report.py reads the timeline.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import DIM, SHAPES, LibMaxsim, unit  # noqa: E402


def marker():
    path = os.environ.get("CUDA_INJECTION64_PATH")
    if not path:
        return lambda name: None
    fn = ctypes.CDLL(path).maxsim_trace_mark
    fn.argtypes = [ctypes.c_char_p]
    return lambda name: fn(name.encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default="textual-10k visual train-inbatch")
    args = ap.parse_args()
    import torch
    mark = marker()
    lib = LibMaxsim(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    out = open(args.json, "w")
    side = torch.cuda.Stream()

    def run(name, fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ms = []
        for _ in range(args.iters):
            mark("py " + name)
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        rec = {"case": "py " + name, "ms": statistics.median(ms), "min_ms": min(ms)}
        out.write(json.dumps(rec) + "\n")
        print(f"{rec['case']:40s} {rec['ms']:.4f} ms (min {rec['min_ms']:.4f})", flush=True)

    for shape in args.shapes.split():
        nq, lq, nd, ld = SHAPES[shape]
        q = unit(torch, (nq, lq, DIM), gen)
        d = unit(torch, (nd, ld, DIM), gen)
        scores = torch.empty(nq, nd, device="cuda", dtype=torch.float32)
        if not shape.startswith("train"):
            cur = torch.cuda.current_stream().cuda_stream
            run(f"{shape} api-dense", lambda: lib.score_matrix(q, d, scores, stream=cur))
            run(f"{shape} api-dense-side-stream", lambda: lib.score_matrix(q, d, scores, stream=side.cuda_stream))
            continue
        argmax = torch.empty(nq, nd, lq, device="cuda", dtype=torch.int32)
        grad = torch.randn(nq, nd, device="cuda", generator=gen)
        gq = torch.empty(nq, lq, DIM, device="cuda", dtype=torch.float32)
        gd = torch.empty(nd, ld, DIM, device="cuda", dtype=torch.float32)
        cur = torch.cuda.current_stream().cuda_stream
        for det in (1, 0):
            def step(det=det):
                lib.score_matrix(q, d, scores, argmax, stream=cur)
                lib.backward(q, d, argmax, grad, gq, gd, det, stream=cur)
            run(f"train api-fwd+bwd-{'det' if det else 'atomic'}", step)
        run("train api-fwd", lambda: lib.score_matrix(q, d, scores, argmax, stream=cur))
        run("train api-fwd-side-stream", lambda: lib.score_matrix(q, d, scores, argmax, stream=side.cuda_stream))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
