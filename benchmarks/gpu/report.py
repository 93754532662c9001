#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Joins gpu_bench.json (libmaxsim CUDA plugin) and baselines.json (cuBLAS, copy bandwidth, naive PyTorch) into
one table: ms, TFLOP/s (TOP/s for int8 screening), GB/s, % of the in-run cuBLAS bf16
rate and of the in-run copy bandwidth, speed-up over the naive baseline, and the target.

GB/s counts the fewest bytes the mode must move (exact: bf16 originals; certified/approximate: int8 codes +
16-byte metadata per token; refinement reads come on top), so % BW near 100 means at the memory floor.
"""
import json
import sys

TARGETS = {  # (shape, mode) -> the project's target ms on an H100
    ("textual-1k", "exact"): 0.06,
    ("textual-10k", "exact"): 0.28,
    ("textual-10k", "certified"): 0.16,
    ("textual-10k", "certified-screen"): 0.16,
    ("colpali-rerank", "exact"): 0.10,
    ("q128", "exact"): 0.12,
    ("visual", "exact"): 0.42,
    ("visual", "certified"): 0.30,
    ("visual", "certified-screen"): 0.30,
    ("train-inbatch", "fwd+bwd-det"): 0.45,
    ("train-inbatch", "fwd+bwd-atomic"): 0.45,
}


def load(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    except FileNotFoundError:
        pass
    return rows


def main():
    bench = load(sys.argv[1])
    base = load(sys.argv[2]) if len(sys.argv) > 2 else []
    peak = next((r["tflops"] for r in base if r.get("baseline") == "cublas_bf16"), None)
    bw = next((r["gbps"] for r in base if r.get("baseline") == "copy_d2d"), None)
    if bw is None:
        bw = next((r["bytes"] / r["ms"] / 1e6 for r in bench if r.get("shape") == "copy"), None)
    naive = {r["shape"]: r for r in base if r.get("baseline") == "naive" and "ms" in r}
    print("in-run: cuBLAS bf16 %s TFLOP/s, device copy %s GB/s (read + write)" %
          ("%.0f" % peak if peak else "?", "%.0f" % bw if bw else "?"))
    hdr = "%-15s %-15s %9s %8s %8s %7s %6s %9s %7s %8s %s" % (
        "shape", "mode", "ms", "TFLOP/s", "GB/s", "%peak", "%BW", "naive ms", "xnaive", "target", "")
    print(hdr)
    print("-" * len(hdr))
    for r in bench:
        if r.get("shape") == "copy":
            continue
        ms = r["ms"]
        tf = r.get("flops", 0) / ms / 1e9
        gbs = r.get("bytes", 0) / ms / 1e6
        pk = "%6.1f" % (100 * tf / peak) if peak else "     ?"
        pb = "%5.1f" % (100 * gbs / bw) if bw else "    ?"
        nv = naive.get(r["shape"])
        nms = "%9.3f" % nv["ms"] if nv else "        -"
        ratio = "%6.1fx" % (nv["ms"] / ms) if nv else "      -"
        tgt = TARGETS.get((r["shape"], r["mode"]))
        verdict = ""
        if tgt is not None:
            verdict = "MET" if ms <= tgt else "missed"
        extra = []
        if "extra_mb" in r:
            extra.append("extra %.2f MB" % r["extra_mb"])
            if r["extra_mb"] > 16:
                verdict += " (memory missed)"
        if "fwd_ms" in r:
            extra.append("fwd %.3f ms" % r["fwd_ms"])
        if "refined_per_token" in r:
            extra.append("refined %.2f/token" % r["refined_per_token"])
        print("%-15s %-15s %9.4f %8.1f %8.0f %7s %6s %s %7s %8s %s %s" % (
            r["shape"], r["mode"], ms, tf, gbs, pk, pb, nms, ratio, "%.3f" % tgt if tgt else "-", verdict,
            "; ".join(extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
