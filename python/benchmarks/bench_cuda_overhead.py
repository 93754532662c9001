# SPDX-License-Identifier: Apache-2.0
"""Where the Python binding's time goes on CUDA tensors (a machine with an NVIDIA GPU, torch and the CUDA plugin:
MAXSIM_PLUGIN_PATH). Per case, the median wall time of one call with a synchronisation after it, beside the same
call's GPU kernels (PyTorch profiler), and with --profile the binding's functions by their own time (cProfile over
the timed calls), so that the host work over the kernels can be read function by function:

  scores-1k     maxsim.scores(Q, D): one 32-token query against 1000 documents of 300 tokens (textual-1k)
  scores-10     the same against 10 documents (the kernels take a few microseconds: the overhead alone)
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
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
