#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""In-run baselines for the GPU benchmark (a machine with an NVIDIA GPU, PyTorch): the cuBLAS bf16 matrix-product rate, the
device-to-device copy bandwidth, and the naive PyTorch MaxSim at fp32 accumulation for every benchmark shape:

    S = einsum('qsh,nth->qnst', Q32, D32)      # the full [Nq, Nd, Lq, Ld] tensor, fp32 (TF32 off)
    scores = S.amax(-1).sum(-1)

with Q32/D32 the bf16 inputs converted to fp32 once, outside the timing. Training: the same forward with
autograd (amax saves its argmax), backward of sum(scores * g). Every figure is the median of CUDA-event-timed
calls after warm-up. Writes one JSON object per line.
"""
import argparse
import json
import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def unit(shape, dtype=torch.bfloat16, gen=None):
    x = torch.randn(*shape, device="cuda", dtype=torch.float32, generator=gen)
    x = x / x.norm(dim=-1, keepdim=True)
    return x.to(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--ceilings-only", action="store_true", help="only the cuBLAS rate and the copy bandwidth")
    args = ap.parse_args()
    out = open(args.json, "w")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()
        print(obj, flush=True)

    # cuBLAS bf16 (random data, never zeros).
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    ms = median_ms(lambda: torch.matmul(a, b), 3, 10)
    emit({"baseline": "cublas_bf16", "ms": ms, "tflops": 2 * n ** 3 / ms / 1e9})
    del a, b
    # Device copy bandwidth (bytes read + written).
    x = torch.empty(1 << 30, device="cuda", dtype=torch.uint8).fill_(1)
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), 3, 10)
    emit({"baseline": "copy_d2d", "ms": ms, "gbps": 2 * x.numel() / ms / 1e6})
    del x, y
    torch.cuda.empty_cache()
    if args.ceilings_only:
        out.close()
        return 0

    shapes = [("textual-1k", 1, 32, 1000, 300), ("textual-10k", 1, 32, 10000, 300),
              ("colpali-rerank", 1, 32, 1000, 1030), ("q128", 1, 128, 1000, 1030),
              ("visual", 1, 1024, 1000, 1024)]
    for name, nq, lq, nd, ld in shapes:
        try:
            q = unit((nq, lq, 128), gen=gen).float()
            d = unit((nd, ld, 128), gen=gen).float()
            fn = lambda: torch.einsum("qsh,nth->qnst", q, d).amax(-1).sum(-1)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            ms = median_ms(fn, 2, 10)
            peak = torch.cuda.max_memory_allocated() - base
            emit({"baseline": "naive", "shape": name, "ms": ms, "scratch_mb": peak / 2 ** 20})
            del q, d
            torch.cuda.empty_cache()
        except RuntimeError as e:  # out of memory: report and go on
            emit({"baseline": "naive", "shape": name, "error": str(e)[:200]})
            torch.cuda.empty_cache()

    # Training in-batch: Nq = Nd = 64, Lq = 32, Ld = 300.
    q = unit((64, 32, 128), gen=gen).float().requires_grad_(True)
    d = unit((64, 300, 128), gen=gen).float().requires_grad_(True)
    g = torch.randn(64, 64, device="cuda", generator=gen)

    def step():
        s = torch.einsum("qsh,nth->qnst", q, d).amax(-1).sum(-1)
        (s * g).sum().backward()

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ms = median_ms(step, 3, 20)
    peak = torch.cuda.max_memory_allocated() - base
    emit({"baseline": "naive", "shape": "train-inbatch", "ms": ms, "scratch_mb": peak / 2 ** 20})
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
