#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders cpu_bench JSON output (Google Benchmark --benchmark_out) as markdown tables.

    python3 scripts/bench-table.py out.json [more.json ...]           full tables
    python3 scripts/bench-table.py --brief out.json [more.json ...]   one headline table
    python3 scripts/bench-table.py --update-docs FILE.md [...]        regenerate the marked tables in docs
    python3 scripts/bench-table.py --check-docs FILE.md [...]         fail if a marked table is out of date

Result files live in benchmarks/results/ (docs/benchmarks.md, "Result files"). A doc quotes a table between
    <!-- bench-table: [--brief] [--stat best] benchmarks/results/NAME.json -->
    <!-- end bench-table -->
lines; --update-docs rewrites what is between them from the named file (paths relative to the repository
root), so every figure a doc quotes comes from a committed result file, and --check-docs (a CTest) proves it.
A GPU result file (benchmarks/results/gpu-*.json, written by benchmarks/gpu/report.py --combine) is rendered by
report.py's tables (--brief: the side-by-side table only).

Several files (e.g. one per thread count) are merged. With --benchmark_repetitions, the median repetition is
used (or the best with --stat best: on a shared machine the least disturbed one); otherwise the single run. Ratios are computed here from GSO/s against the baselines of the same shape
and thread count found in the same file (x OpenBLAS, x naive); % of peak comes from the benchmark's own
counter (the peak measured in the same process). Only the Python standard library is used.
"""
import argparse
import json
import os
import re
import sys

MODES = ["exact", "certified", "approximate"]
BASELINES = ["naive", "openblas", "onednn"]
NOT_KERNELS = BASELINES + ["dense"]  # dense: the selected kernel fed dense documents, not a kernel of its own


def score_key(name, b):
    """Higher is better: the figure a run is ranked by when choosing the median or best repetition."""
    if name.startswith("pack/"):
        return -b.get("us_per_doc", 0.0)
    if name.startswith("peak/"):
        return b.get("G_ops_per_s", 0.0)
    return b.get("GSO_per_s", 0.0)


def load(paths, stat="median"):
    """{(path, name): run}. With repetitions, the median (or best) repetition by score_key; GB's own median
    aggregate when only aggregates were written. Errored runs are kept (they show as ERROR)."""
    runs, contexts = {}, []
    for path in paths:
        with open(path) as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            # A run cut short (timeout, crash) leaves the benchmarks array open: close it and keep what finished.
            cut = text.rstrip().rstrip(",")
            cut = cut[:cut.rfind("}") + 1] if "}" in cut else cut
            try:
                data = json.loads(cut + "\n  ]\n}")
                print("bench-table: note: %s was incomplete (run cut short); using the finished runs" % path,
                      file=sys.stderr)
            except json.JSONDecodeError:
                print("bench-table: warning: %s is not valid JSON; skipped" % path, file=sys.stderr)
                continue
        contexts.append((path, data.get("context", {})))
        reps, medians = {}, {}
        for b in data.get("benchmarks", []):
            name = re.sub(r"/real_time$", "", b.get("run_name") or b["name"])
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians[name] = b
            else:
                reps.setdefault(name, []).append(b)
        for name in set(reps) | set(medians):
            rs = reps.get(name, [])
            if rs:
                if any(r.get("error_occurred") for r in rs):
                    runs[(path, name)] = next(r for r in rs if r.get("error_occurred"))
                    continue
                rs = sorted(rs, key=lambda r: score_key(name, r))
                runs[(path, name)] = rs[-1] if stat == "best" else rs[(len(rs) - 1) // 2]
            else:
                runs[(path, name)] = medians[name]
    return runs, contexts


def parse_name(name):
    """maxsim/<shape>/<impl>/<mode>/threads:T -> (family, shape, impl, mode, T)."""
    m = re.match(r"^(maxsim)/([^/]+)/([^/]+)/([^/]+)/threads:(\d+)$", name)
    if m:
        return m.group(1), m.group(2), m.group(3), m.group(4), int(m.group(5))
    m = re.match(r"^(peak|pack)/([^/]+)/threads:(\d+)$", name)
    if m:
        return m.group(1), m.group(2), None, None, int(m.group(3))
    return None


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if abs(v) >= 1e6:
        return "%.2fM" % (v / 1e6)
    if abs(v) >= 1e4:
        return "%.1fK" % (v / 1e3)
    return ("%." + str(digits) + "f") % v


SHAPE_ORDER = ["Lq32_Ld180_N1000_d128", "Lq32_Ld300_N1000_d128", "Lq1024_Ld1024_N16_d128",
               "Lq32_Ld180_N1000_d64", "Lq32_Ld180_N1000_d96"]


def shape_rank(shape):
    return SHAPE_ORDER.index(shape) if shape in SHAPE_ORDER else len(SHAPE_ORDER)


def shape_title(shape):
    m = re.match(r"Lq(\d+)_Ld(\d+)_N(\d+)_d(\d+)", shape)
    if not m:
        return shape
    lq, ld, n, d = m.groups()
    return "Lq=%s x Ld=%s, %s documents, d=%s (one query)" % (lq, ld, n, d)


def kernel_order(ctx):
    """Kernel names in the order the context lists them (kernel list order)."""
    return [k[len("kernel_"):] for k in ctx if k.startswith("kernel_") and k != "kernel_selected"]


def machine_lines(contexts):
    out = []
    for path, ctx in contexts:
        out.append("- `%s`: %s" % (path, ctx.get("command", "(command not recorded)")))
        if ctx.get("note"):
            out.append("  - note: " + ctx["note"])
        peaks = ", ".join("%s %s" % (k[len("peak_"):], v) for k, v in ctx.items()
                          if k.startswith("peak_") and not v.startswith("skipped"))
        out.append("  - %s (%s cores online); %s; libmaxsim %s, selected kernel %s; %s; threads %s; replicas %s; %s" % (
            ctx.get("cpu_brand", "?"), ctx.get("cores_online", ctx.get("num_cpus", "?")), ctx.get("date", "?"),
            ctx.get("libmaxsim", "?"),
            ctx.get("kernel_selected", "?"), "LLC %.0f MB" % (int(ctx.get("llc_bytes", "0")) / 2**20),
            ctx.get("threads", "?"), ctx.get("replicas", "?"), "load average " + ",".join(
                "%.2f" % x for x in ctx.get("load_avg", []))))
        out.append("  - peaks measured at start-up (G ops/s): " + (peaks or "none"))
        skipped = ["%s (%s)" % (k, v) for k, v in ctx.items() if isinstance(v, str) and v.startswith("skipped")]
        if skipped:
            out.append("  - skipped: " + "; ".join(skipped))
        for k, v in ctx.items():
            if k.startswith("warning"):
                out.append("  - **warning** (%s): %s" % (k, v))
    return out


def full(runs, contexts):
    lines = ["## Machine and run", ""] + machine_lines(contexts) + [""]
    paths = [p for p, _ in contexts]
    order = []
    for _, ctx in contexts:
        for k in kernel_order(ctx):
            if k not in order:
                order.append(k)
    parsed = {}
    for (path, name), b in runs.items():
        p = parse_name(name)
        if p:
            parsed[(path,) + p] = b

    peak_rows = sorted(k for k in parsed if k[1] == "peak")
    if peak_rows:
        lines += ["## Peaks (Google Benchmark runs of the peak loops)", "",
                  "| loop | threads | G ops/s |", "|---|---:|---:|"]
        for k in peak_rows:
            lines.append("| %s | %d | %s |" % (k[2], k[5], fmt(parsed[k].get("G_ops_per_s"))))
        lines.append("")
    pack_rows = sorted(k for k in parsed if k[1] == "pack")
    if pack_rows:
        lines += ["## Packing", "",
                  "| what | threads | us per document | documents/s | error |",
                  "|---|---:|---:|---:|---|"]
        for k in pack_rows:
            b = parsed[k]
            lines.append("| %s | %d | %s | %s | %s |" % (
                k[2], k[5], fmt(b.get("us_per_doc"), 2),
                fmt(b.get("docs_per_s", 1e6 / b["us_per_doc"] if b.get("us_per_doc") else None)),
                b.get("error_message", "")))
        lines.append("")

    shapes = []
    for k in parsed:
        if k[1] == "maxsim" and k[2] not in shapes:
            shapes.append(k[2])
    shapes.sort(key=shape_rank)
    for shape in shapes:
        lines += ["## " + shape_title(shape), "",
                  "| implementation | mode | threads | docs/s | GSO/s | % peak | % i8 peak | x OpenBLAS | x naive "
                  "| refined / query token |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for path in paths:
            threads = sorted({k[5] for k in parsed if k[0] == path and k[1] == "maxsim" and k[2] == shape})
            for t in threads:
                def gso(impl, mode="exact"):
                    b = parsed.get((path, "maxsim", shape, impl, mode, t))
                    return b.get("GSO_per_s") if b and not b.get("error_occurred") else None
                blas, naive = gso("openblas"), gso("naive")
                impls = BASELINES + order + sorted({k[3] for k in parsed if k[2] == shape} - set(BASELINES + order))
                for impl in impls:
                    for mode in MODES:
                        b = parsed.get((path, "maxsim", shape, impl, mode, t))
                        if not b:
                            continue
                        if b.get("error_occurred"):
                            lines.append("| %s | %s | %d | ERROR: %s | | | | | | |" % (
                                impl, mode, t, b.get("error_message", "")))
                            continue
                        g = b.get("GSO_per_s")
                        lines.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                            impl, mode, t, fmt(b.get("docs_per_s")), fmt(g), fmt(b.get("pct_peak")),
                            fmt(b.get("pct_i8_peak")),
                            fmt(g / blas, 2) if blas and impl != "openblas" else "-",
                            fmt(g / naive, 1) if naive and impl != "naive" else "-",
                            fmt(b.get("refined_per_qtok"), 2)))
        lines.append("")
    return "\n".join(lines)


def brief(runs, contexts):
    """Per shape and thread count: OpenBLAS, and the best kernel per mode (GSO/s, % peak, x OpenBLAS)."""
    parsed = {}
    for (path, name), b in runs.items():
        p = parse_name(name)
        if p and not b.get("error_occurred"):
            parsed[(path,) + p] = b
    lines = machine_lines(contexts) + [""]
    lines += ["| shape | threads | OpenBLAS GSO/s | best exact | best certified | best approximate |",
             "|---|---:|---:|---|---|---|"]
    keys = sorted({(k[0], k[2], k[5]) for k in parsed if k[1] == "maxsim"},
                  key=lambda x: (shape_rank(x[1]), x[1], x[2]))
    for path, shape, t in keys:
        blas = parsed.get((path, "maxsim", shape, "openblas", "exact", t), {}).get("GSO_per_s")
        cells = []
        for mode in MODES:
            best = None
            for k, b in parsed.items():
                if k[0] == path and k[1] == "maxsim" and k[2] == shape and k[5] == t and k[4] == mode \
                        and k[3] not in NOT_KERNELS:
                    if best is None or b["GSO_per_s"] > best[1]["GSO_per_s"]:
                        best = (k[3], b)
            if best is None:
                cells.append("-")
            else:
                g = best[1]["GSO_per_s"]
                cells.append("%s %s GSO/s (%s%% peak%s)" % (
                    best[0], fmt(g), fmt(best[1].get("pct_peak"), 0),
                    ", %.2fx OpenBLAS" % (g / blas) if blas else ""))
        lines.append("| %s | %d | %s | %s |" % (shape, t, fmt(blas), " | ".join(cells)))
    packs = sorted((k, b) for k, b in parsed.items() if k[1] == "pack")
    if packs:
        lines.append("")
        lines.append("packing, us per document: " + "; ".join(
            "%s %d thread(s) %s" % (k[2], k[5], fmt(b.get("us_per_doc"), 2)) for k, b in packs))
    return "\n".join(lines)


def gpu_result(path):
    """Whether `path` is a GPU result file (benchmarks/gpu/report.py --combine): {context, bench, baselines, peers}."""
    try:
        with open(path) as f:
            head = f.read(4096)
        return head.lstrip().startswith("{") and '"context"' in head and os.path.basename(path).startswith("gpu")
    except OSError:
        return False


def render(paths, brief_table, stat):
    if len(paths) == 1 and gpu_result(paths[0]):
        # GPU result files have their own tables (benchmarks/gpu/report.py).
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("gpu_report", os.path.join(here, "..", "benchmarks", "gpu", "report.py"))
        report = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(report)
        return report.render_result(paths[0], brief_table)
    runs, contexts = load(paths, stat)
    if not runs:
        raise ValueError("no benchmark results in " + ", ".join(paths))
    return brief(runs, contexts) if brief_table else full(runs, contexts)


MARK = re.compile(r"^<!-- bench-table: (.*?) -->\n(.*?)^<!-- end bench-table -->\n", re.M | re.S)


def refresh(doc, root):
    """The doc's text with every marked block regenerated from its result files (paths relative to root)."""
    with open(doc) as f:
        text = f.read()

    def one(m):
        args = m.group(1).split()
        brief_table = "--brief" in args
        stat = "best" if "--stat" in args and args[args.index("--stat") + 1] == "best" else "median"
        files = [a for a in args if a.endswith(".json")]
        if not files:
            raise ValueError("%s: a bench-table marker names no .json file: %s" % (doc, m.group(1)))
        cwd = os.getcwd()
        os.chdir(root)  # so that the table names the files as the marker does
        try:
            table = render(files, brief_table, stat)
        finally:
            os.chdir(cwd)
        note = "_Generated by `python3 scripts/bench-table.py --update-docs` from %s; do not edit by hand._" % (
            ", ".join("`%s`" % f for f in files))
        return "<!-- bench-table: %s -->\n%s\n\n%s\n<!-- end bench-table -->\n" % (m.group(1), note, table)

    return text, MARK.sub(one, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="cpu_bench --benchmark_out files (or docs with --update/--check-docs)")
    ap.add_argument("--brief", action="store_true", help="one headline table")
    ap.add_argument("--stat", choices=["median", "best"], default="median",
                    help="with --benchmark_repetitions: the median (default) or the best repetition")
    ap.add_argument("--update-docs", action="store_true", help="regenerate the marked tables in the given docs")
    ap.add_argument("--check-docs", action="store_true", help="exit 1 if a marked table in the docs is stale")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="repository root that marker paths are relative to (default: this script's ..)")
    args = ap.parse_args()
    try:
        if args.update_docs or args.check_docs:
            stale = []
            for doc in args.files:
                old, new = refresh(doc, args.root)
                if old != new:
                    stale.append(doc)
                    if args.update_docs:
                        tmp = doc + ".tmp"
                        with open(tmp, "w") as f:
                            f.write(new)
                        os.replace(tmp, doc)
            if args.check_docs and stale:
                sys.exit("bench-table: out of date (run python3 scripts/bench-table.py --update-docs %s): %s" % (
                    " ".join(args.files), ", ".join(stale)))
            return
        print(render(args.files, args.brief, args.stat))
    except (OSError, ValueError) as e:
        sys.exit("bench-table: %s" % e)


if __name__ == "__main__":
    main()
