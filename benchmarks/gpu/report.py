#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tables of a GPU benchmark run, from what that run measured (no number is written into this script).

    report.py --bench gpu-bench.json --baselines gpu-baselines.json --peers peers.json \
              [--floor api-floor-probe.json] [--combine result.json --command CMD --machine machine.txt]
    report.py --result benchmarks/results/gpu-h100.json        # the tables of a committed result file

Inputs (one JSON object per line): gpu_bench (libmaxsim: kernel rows timed with CUDA events on the plugin's
internal calls, public-API rows timed with the host clock, the read and copy bandwidth), baselines.py (cuBLAS
bf16 rate, copy bandwidth, naive PyTorch) and peers.py (libmaxsim's public C API and the Triton peers on the same
torch tensors, one process per shape: end-to-end, event and profiler kernel times), and optionally
api_floor_probe (the floors of a synchronous call in plain CUDA, printed under the ceilings). --combine writes one
result file holding them with the command, the machine and the date.

Table 1, side by side per shape (ms; ratios > 1 mean libmaxsim is faster):
  peer kernel    the best peer's kernel-only time (sum of its GPU kernels per call, profiler)
  lib kernel     libmaxsim's kernel-only time: its GPU kernels per public call but input checks (profiler,
                 peers.py), or where peers.py has no row, the internal call timed with CUDA events (gpu_bench)
  check          input-check kernels per public call (kernels named *Check*), not in lib kernel
  API gpu        the public C API with GPU tensors in and out, from C (gpu_bench api-dense / api-fwd+bwd-atomic:
                 wall clock per call, which returns when its stream has finished)
  API resident   the public C API with a resident packed corpus, host query in, host scores out (gpu_bench)
  lib e2e, peer e2e   wall clock per call from Python, synchronised (peers.py: libmaxsim through ctypes, the
                 best peer)
  k ratio        peer kernel / lib kernel;  e2e ratio: peer e2e / lib e2e
  overhead       API gpu - the device work of the same call timed with CUDA events in the same process
                 (gpu_bench dense-kernels / fwd+bwd-atomic), in us and as % of it
  %read          libmaxsim's kernel-only GB/s (the fewest bytes: bf16 corpus once) over the in-run read rate
                 (the fastest of read_bw.cu's read variants over 2 GiB, gpu_bench's "read" row, which names it)
  %ceil          the memory-bound ceiling of the shape: that fastest read variant reading the shape's own
                 document bytes, rotating among the same copies, over libmaxsim's exact kernel row, both timed
                 by gpu_bench with CUDA events around launches enqueued back to back (read-same-bytes / exact);
                 the launch, ramp-up and tail of a read of that size are in both
  %GEMM          libmaxsim's kernel-only TFLOP/s over the in-run cuBLAS bf16 rate
Table 2, the Python binding (peers.py's libmaxsim-py rows: the maxsim package on the same tensors) per shape:
  py e2e         wall clock per maxsim.scores call (training: maxsim.torch.maxsim forward + autograd backward,
                 atomic), synchronised; py ordered: the same calls with stream_ordered=True
  py events      CUDA events around binding calls enqueued back to back (stream-ordered where there is a row)
  ctypes e2e     the C API through ctypes (lib e2e above); lib kernel as above
  py over kernel py e2e - lib kernel (as in Table 1: without the input-check kernels), in us and as % of it
  peer e2e, e2e ratio   the best peer's wall clock, and it over py e2e (> 1: the binding is faster)
  bits           whether the binding's scores have the ctypes call's bits (same_bits); n/a for training (no
                 check), - where the run had no ctypes row to compare with
Table 3: every gpu_bench row with TFLOP/s, GB/s, % of the in-run rates and the speed-up over naive PyTorch.
"""
import argparse
import json
import sys
from typing import NamedTuple, Optional

ORDER = ["textual-100", "colpali-100", "textual-1k", "textual-10k", "colpali-rerank", "q128", "visual",
         "serve-textual-10k-64q", "serve-colpali-16q", "train-inbatch"]


def load_lines(path):
    rows = []
    if not path:
        return rows
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except FileNotFoundError:
        pass
    return rows


def fmt(v, spec="%.4f"):
    return spec % v if isinstance(v, (int, float)) else "-"


class ShapeRows(NamedTuple):
    """One shape's peers.py rows without errors: libmaxsim's C API row (training: atomic) and the fastest peer by
    kernel-only and by end-to-end time (every implementation but libmaxsim's own, C API and binding, and the
    forward-only training rows)."""
    rows: list
    lib: Optional[dict]
    best_kernel: Optional[dict]
    best_e2e: Optional[dict]


def shape_rows(peers, shape):
    rows = [r for r in peers if r.get("shape") == shape and "error" not in r]
    lib_name = "libmaxsim-atomic" if shape.startswith("train") else "libmaxsim"
    lib = next((r for r in rows if r["impl"] == lib_name), None)
    others = [r for r in rows if not r["impl"].startswith("libmaxsim") and not r["impl"].endswith("-fwd")]
    return ShapeRows(rows, lib, min(others, key=lambda r: r["kernel_ms"]) if others else None,
                     min(others, key=lambda r: r["e2e_ms"]) if others else None)


def lib_kernel_ms(lib):
    """libmaxsim's kernel-only time of a C API row: its GPU kernels per call but the input checks."""
    return lib["kernel_ms"] - lib.get("check_ms", 0.0) if lib else None


def floor_line(floor, bmap):
    """The in-run floors of a synchronous call (api_floor_probe.cu), beside textual-1k's resident API call."""
    if not isinstance(floor, dict):
        return []
    rows = {r.get("name"): r.get("us") for r in floor.get("rows", []) if isinstance(r, dict)}
    wait = rows.get("call query=empty wait=stream-sync scores=mapped")
    call, kern = rows.get("call query=h2d wait=stream-sync scores=mapped"), rows.get("kernel-only query=h2d")
    if wait is None or call is None or kern is None:
        return []
    res, ex = bmap.get(("textual-1k", "api-resident")), bmap.get(("textual-1k", "exact"))
    here = ("; textual-1k's API resident call is %.1f us over its exact row" % ((res["ms"] - ex["ms"]) * 1e3)
            if res and ex else "")
    return ["in-run floors of a synchronous call (api_floor_probe.cu, plain CUDA, no library): an empty kernel launched "
            "and waited for %.1f us; a %.0f MB read kernel with an %d-byte query through a pinned stage and mapped "
            "scores (the API resident path) %.1f us over the same kernel enqueued back to back%s" % (
                wait, floor.get("bytes", 0) / 1e6, floor.get("query_bytes", 0), call - kern, here)]


def side_by_side(bench, base, peers, floor=None):
    read_bw = next((r["bytes"] / r["ms"] / 1e6 for r in bench if r.get("shape") == "read"), None)
    cublas = next((r["tflops"] for r in base if r.get("baseline") == "cublas_bf16"), None)
    copy_bw = next((r["gbps"] for r in base if r.get("baseline") == "copy_d2d"), None)
    if copy_bw is None:
        copy_bw = next((r["bytes"] / r["ms"] / 1e6 for r in bench if r.get("shape") == "copy"), None)
    rrow = next((r for r in bench if r.get("shape") == "read"), None)
    nvar = len({r.get("mode") for r in bench if r.get("shape") == "read-variant"})
    how = " (%s, %s blocks: the fastest of %d read variants)" % (rrow["variant"], rrow.get("blocks"), nvar) if (
        rrow and "variant" in rrow) else ""
    out = ["in-run ceilings: read kernel %s GB/s%s, device copy %s GB/s (read + write), cuBLAS bf16 %s TFLOP/s" % (
        fmt(read_bw, "%.0f"), how, fmt(copy_bw, "%.0f"), fmt(cublas, "%.0f"))]
    bmap = {(r.get("shape"), r.get("mode")): r for r in bench}
    out += floor_line(floor, bmap)
    dev = next((r.get("device") for r in peers if r.get("device")), None)
    versions = sorted({"%s %s" % (r["impl"], r["version"]) for r in peers
                       if r.get("version") and not r["impl"].startswith("libmaxsim")})
    if dev or versions:
        out.append("peers.py on %s: %s" % (dev or "?", ", ".join(versions) or "no peer rows"))
    # %ceil only where the run measured the per-shape ceilings (read-same-bytes rows).
    has_ceil = any(r.get("mode") == "read-same-bytes" for r in bench)
    hdr = ("| shape | peer kernel | lib kernel | check | API gpu | API resident | lib e2e | peer e2e | k ratio "
           "| e2e ratio | overhead us (%) | %read |" + (" %ceil |" if has_ceil else "") + " %GEMM |")
    out += [hdr, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if has_ceil else "") + "---:|"]
    for shape in ORDER:
        is_train = shape.startswith("train")
        _, lib, pk, pe = shape_rows(peers, shape)
        kernel_row = bmap.get((shape, "fwd+bwd-atomic" if is_train else "exact"))
        if lib is None and kernel_row is None and pk is None:
            continue
        lk = lib_kernel_ms(lib) if lib else (kernel_row["ms"] if kernel_row else None)
        chk = lib.get("check_ms") if lib else None
        lib_e2e = lib["e2e_ms"] if lib else None
        r = bmap.get((shape, "api-fwd+bwd-atomic" if is_train else "api-dense"))
        api_gpu = r["ms"] if r else None
        res = bmap.get((shape, "api-resident"))
        kratio = pk["kernel_ms"] / lk if pk and lk else None
        eratio = pe["e2e_ms"] / lib_e2e if pe and lib_e2e else None
        # Overhead within one process (gpu_bench): the public call against the device work of the same call.
        kr = bmap.get((shape, "fwd+bwd-atomic" if is_train else "dense-kernels"))
        over = ("%.1f (%.0f%%)" % ((api_gpu - kr["ms"]) * 1e3, 100 * (api_gpu - kr["ms"]) / kr["ms"])
                if api_gpu and kr else "-")
        ref = kernel_row or bmap.get((shape, "exact"))
        pread = pgemm = None
        if ref and lk:
            if read_bw and not is_train:
                pread = 100 * ref["bytes"] / lk / 1e6 / read_bw
            if cublas:
                pgemm = 100 * ref["flops"] / lk / 1e9 / cublas
        same = bmap.get((shape, "read-same-bytes"))
        pceil = 100 * same["ms"] / kernel_row["ms"] if same and kernel_row and not is_train else None
        out.append("| %s | %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |%s %s |" % (
            shape, fmt(pk["kernel_ms"] if pk else None), " (%s)" % pk["impl"] if pk else "", fmt(lk), fmt(chk),
            fmt(api_gpu), fmt(res["ms"] if res else None), fmt(lib_e2e), fmt(pe["e2e_ms"] if pe else None),
            fmt(kratio, "%.2f"), fmt(eratio, "%.2f"), over, fmt(pread, "%.0f"),
            " %s |" % fmt(pceil, "%.0f") if has_ceil else "", fmt(pgemm, "%.0f")))
    errs = [r for r in peers if "error" in r]
    for r in errs:
        out.append("- %s %s: %s" % (r.get("shape"), r.get("impl"), r["error"]))
    bad = [r for r in peers if isinstance(r.get("rel_err"), float) and r["rel_err"] > 1e-2]
    for r in bad:
        out.append("- %s %s: max relative error %.3g against the float64 reference" % (r["shape"], r["impl"], r["rel_err"]))
    errs_lib = [r for r in peers if r.get("impl") == "libmaxsim" and isinstance(r.get("rel_err"), float)]
    if errs_lib:
        out.append("- libmaxsim max relative error against float64 over the shapes: %.2g; peers: %s" % (
            max(r["rel_err"] for r in errs_lib),
            ", ".join("%s %.2g" % (i, max(r["rel_err"] for r in peers if r.get("impl") == i and
                                         isinstance(r.get("rel_err"), float)))
                      for i in sorted({r["impl"] for r in peers if not r.get("impl", "lib").startswith("libmaxsim")
                                       and isinstance(r.get("rel_err"), float)}))))
    diff = [r for r in bench if r.get("same_bits") == 0]
    for r in diff:
        out.append("- %s %s: %s scores differ in their bits from the kernel rows" % (r["shape"], r["mode"], r.get("differing")))
    return out, read_bw, cublas, copy_bw


def binding(peers):
    """Table 2: the Python binding's rows (libmaxsim-py*) beside the ctypes call and the best peer."""
    if not any(r.get("impl", "").startswith("libmaxsim-py") for r in peers):
        return []
    out = ["", "The Python binding (maxsim package) on the same tensors, ms:", "",
           "| shape | py e2e | py ordered | py events | ctypes e2e | lib kernel | py over kernel us (%) | peer e2e "
           "| e2e ratio | bits |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for shape in ORDER:
        is_train = shape.startswith("train")
        prs, lib, _, pe = shape_rows(peers, shape)
        py = next((r for r in prs if r["impl"] == ("libmaxsim-py-atomic" if is_train else "libmaxsim-py")), None)
        if py is None:
            continue
        ordered = next((r for r in prs if r["impl"] == "libmaxsim-py-ordered"), None)
        lk = lib_kernel_ms(lib)
        over = ("%.1f (%.0f%%)" % ((py["e2e_ms"] - lk) * 1e3, 100 * (py["e2e_ms"] - lk) / lk) if lk else "-")
        bits = "n/a" if is_train else "-" if "same_bits" not in py else ("same" if py["same_bits"] and (
            ordered is None or ordered.get("same_bits", 1)) else "DIFFER")
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            shape, fmt(py["e2e_ms"]), fmt(ordered["e2e_ms"] if ordered else None),
            fmt((ordered or py)["device_ms"]), fmt(lib["e2e_ms"] if lib else None), fmt(lk), over,
            fmt(pe["e2e_ms"] if pe else None), fmt(pe["e2e_ms"] / py["e2e_ms"] if pe else None, "%.2f"), bits))
    mods = sorted({"%s from %s%s" % (r.get("version"), r.get("module"), ", running " + " + ".join(
                       r["libmaxsim_loaded"]) if r.get("libmaxsim_loaded") else "")
                   for r in peers if r.get("impl", "").startswith("libmaxsim-py") and r.get("module")})
    if mods:
        out.append("- maxsim package: " + "; ".join(mods))
    return out


def detail(bench, base, read_bw, cublas):
    naive = {r["shape"]: r for r in base if r.get("baseline") == "naive" and "ms" in r}
    out = ["| shape | mode | ms | TFLOP/s | GB/s | %GEMM | %read | naive ms | x naive | |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in bench:
        if r.get("shape") in ("copy", "read", "read-variant", "sm-clock") or "ms" not in r:
            continue
        ms = r["ms"]
        tf = r.get("flops", 0) / ms / 1e9
        gbs = r.get("bytes", 0) / ms / 1e6
        nv = naive.get(r["shape"])
        extra = []
        if "extra_mb" in r:
            extra.append("extra %.2f MB" % r["extra_mb"])
        if "fwd_ms" in r:
            extra.append("fwd %.4f ms" % r["fwd_ms"])
        if "refined_per_token" in r:
            extra.append("refined %.2f/token" % r["refined_per_token"])
        if "same_bits" in r:
            extra.append("same bits as kernel rows" if r["same_bits"] else "%s scores differ" % r.get("differing"))
        out.append("| %s | %s | %.4f | %.1f | %.0f | %s | %s | %s | %s | %s |" % (
            r["shape"], r["mode"], ms, tf, gbs, fmt(100 * tf / cublas if cublas else None, "%.1f"),
            fmt(100 * gbs / read_bw if read_bw else None, "%.1f"), fmt(nv["ms"] if nv else None, "%.3f"),
            fmt(nv["ms"] / ms if nv else None, "%.1fx"), "; ".join(extra)))
    return out


def clock_table(bench):
    """The SM clock each timed row's calls ran at (gpu_bench's sm_* members, sm_clock.cu): each SM's cycle counter
    against the global nanosecond timer over batches of calls back to back, the median SM. Beside each row, its
    time as a fraction of the same-bytes read's, by the events median (the %ceil column) and by the batches' own
    time per call (no events between calls), and its SM cycles per call as a fraction of the read's: a memory-bound
    row's cycles fall with its clock, so that last fraction is no clock-free measure of its work. Empty for runs
    that did not measure it."""
    rows = [r for r in bench if "sm_mhz" in r and r.get("shape") not in ("read", "sm-clock")]
    if not rows:
        return []
    bmap = {(r.get("shape"), r.get("mode")): r for r in bench}
    read = next((r for r in bench if r.get("shape") == "read" and "sm_mhz" in r), None)
    idle = next((r for r in bench if r.get("shape") == "sm-clock" and "sm_mhz" in r), None)
    timer = (", the global timer %.4f of the host's clock" % idle["timer_over_host"]
             if idle and idle.get("timer_over_host") else "")
    out = ["", "SM clock of each row's calls, by the SMs' own cycle counters against the global timer (sm_clock.cu, "
           "median SM; 2 GiB read %s MHz, SMs idle beside one spinning block %s MHz%s):" % (
               fmt(read["sm_mhz"] if read else None, "%.0f"), fmt(idle["sm_mhz"] if idle else None, "%.0f"), timer),
           "", "| shape | row | ms | batch us/call | MHz | SMs' range | cycles/call | of the same-bytes read: by events "
           "| by batch time | by cycles |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]

    # A row whose stamps reached fewer SMs than the others' (nothing guarantees every SM a stamp block) says so.
    most = max(r.get("sm_clock_sms", 0) for r in rows)

    def frac(same, r, key):
        return 100 * same[key] / r[key] if same and same.get(key) and r.get(key) else None
    for r in rows:
        same = bmap.get((r["shape"], "read-same-bytes"))
        ns = r.get("sm_ns_per_call")
        sms = r.get("sm_clock_sms", most)
        out.append("| %s | %s | %s | %s | %.0f%s | %.0f-%.0f | %.0f | %s | %s | %s |" % (
            r["shape"], r["mode"], fmt(r.get("ms")), fmt(ns / 1e3 if ns else None, "%.2f"), r["sm_mhz"],
            " (%d of %d SMs)" % (sms, most) if sms < most else "",
            r.get("sm_mhz_low", 0), r.get("sm_mhz_high", 0), r.get("sm_cycles_per_call", 0),
            fmt(frac(same, r, "ms"), "%.0f%%"), fmt(frac(same, r, "sm_ns_per_call"), "%.0f%%"),
            fmt(frac(same, r, "sm_cycles_per_call"), "%.0f%%")))
    return out


def tables(bench, base, peers, ctx, brief, floor=None):
    """The report's text: the run line, the side-by-side table, and (unless brief) the full table."""
    out = []
    if ctx:
        gpu = next((l.strip() for l in ctx.get("machine", "").splitlines() if "H100" in l or "H200" in l), "")
        out += ["Run: `%s` at %s, revision %s%s" % (ctx.get("command"), ctx.get("date"), ctx.get("revision"),
                                                   "; " + " ".join(gpu.split()) if gpu else "")]
        if ctx.get("note"):  # what was left out of the run's file, and why
            out += ["Note: " + ctx["note"]]
        out += [""]
    t1, read_bw, cublas, _ = side_by_side(bench, base, peers, floor)
    out += t1 + binding(peers)
    if not brief:
        out += clock_table(bench) + [""] + detail(bench, base, read_bw, cublas)
        var = [r for r in bench if r.get("shape") == "read-variant"]
        if var:
            out += ["", "Read variants over 2 GiB (read_bw.cu): " + ", ".join(
                "%s/%s %.0f" % (r["mode"], r.get("blocks"), r["bytes"] / r["ms"] / 1e6)
                for r in sorted(var, key=lambda r: r["ms"] / r["bytes"])) + " GB/s"]
    return "\n".join(out)


def render_result(path, brief):
    """The tables of a combined result file (scripts/bench-table.py quotes them in docs)."""
    with open(path) as f:
        res = json.load(f)
    return tables(res["bench"], res["baselines"], res["peers"], res["context"], brief, res.get("floor"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench")
    ap.add_argument("--baselines")
    ap.add_argument("--peers")
    ap.add_argument("--result", help="a combined result file (written by --combine)")
    ap.add_argument("--combine", help="write one result file holding all inputs, the command, machine and date")
    ap.add_argument("--command", default="")
    ap.add_argument("--revision", help="the source revision (default: git describe)")
    ap.add_argument("--machine", help="a text file describing the machine (nvidia-smi, lscpu)")
    ap.add_argument("--brief", action="store_true", help="table 1 only")
    ap.add_argument("--clock", action="store_true", help="the SM clock table only (gpu_bench's sm_* members)")
    ap.add_argument("--floor", help="api_floor_probe's JSON (the synchronous call's floors in plain CUDA)")
    args = ap.parse_args()
    if args.result:
        with open(args.result) as f:
            res = json.load(f)
        bench, base, peers, ctx = res["bench"], res["baselines"], res["peers"], res["context"]
        floor = res.get("floor")
    else:
        bench, base, peers = load_lines(args.bench), load_lines(args.baselines), load_lines(args.peers)
        ctx, floor = None, None
    if args.floor:
        with open(args.floor) as f:
            floor = json.load(f)
    if args.combine:
        import datetime
        import subprocess
        machine = open(args.machine).read() if args.machine else ""
        rev = args.revision or subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                              text=True).stdout.strip()
        ctx = {"command": args.command, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "revision": rev or "unknown", "machine": machine}
        res = {"context": ctx, "bench": bench, "baselines": base, "peers": peers}
        if floor is not None:
            res["floor"] = floor
        with open(args.combine, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    print("\n".join(clock_table(bench)[1:]) if args.clock else tables(bench, base, peers, ctx, args.brief, floor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
