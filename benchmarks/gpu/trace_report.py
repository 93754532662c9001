#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a public call's time goes, from a timeline of benchmarks/gpu/cupti_trace.cc.

    python3 benchmarks/gpu/trace_report.py trace.tsv [--only 'api-dense,api-fwd'] [--calls 2]

The records between one mark and the next are one call (API calls by their start on the host; kernels, copies
and memsets by the API call that enqueued them). Per mark name, medians over its calls, in microseconds from the
mark: the call's end (the end of its last API call), the first and last GPU activity, the GPU's busy time, the
host's time outside API calls (the library's own work), and the sum of each API function's time; then, for the
call of median length, every record in order.
"""
import argparse
import collections
import statistics
import sys


def load(path):
    marks, api, gpu = [], [], []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 6:
                continue
            kind, t0, t1, name, corr = p[0], int(p[1]), int(p[2]), p[3], int(p[4] or 0)
            if kind == "mark":
                marks.append((t0, name))
            elif kind in ("runtime", "driver"):
                api.append((t0, t1, kind, name, corr))
            elif kind in ("kernel", "memcpy", "memset"):
                gpu.append((t0, t1, kind, name, corr, p[6] if len(p) > 6 else ""))
            elif kind == "dropped":
                print(f"warning: CUPTI dropped {name} records", file=sys.stderr)
    marks.sort()
    api.sort()
    gpu.sort()
    return marks, api, gpu


def short(name, n=60):
    name = name.replace("mscuda::(anonymous namespace)::", "")
    return name if len(name) <= n else name[:n] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--only", default="", help="comma-separated parts of mark names (default: every mark)")
    ap.add_argument("--calls", type=int, default=1, help="calls listed record by record per mark name")
    args = ap.parse_args()
    marks, api, gpu = load(args.trace)
    only = [s for s in args.only.split(",") if s]
    by_corr = {}
    for g in gpu:
        by_corr.setdefault(g[4], []).append(g)
    # One call per mark: [mark, next mark).
    calls = collections.defaultdict(list)
    ai = 0
    for k, (t, name) in enumerate(marks):
        end = marks[k + 1][0] if k + 1 < len(marks) else float("inf")
        while ai < len(api) and api[ai][0] < t:
            ai += 1
        j = ai
        recs = []
        while j < len(api) and api[j][0] < end:
            recs.append(api[j])
            j += 1
        calls[name].append((t, recs))
    for name, lst in calls.items():
        if only and not any(o in name for o in only):
            continue
        rows = []
        for t, recs in lst:
            if not recs:
                continue
            g = [x for r in recs for x in by_corr.get(r[4], [])]
            # Nested API records (a runtime call and the driver calls inside it) overlap: count the union.
            covered, cur_s, cur_e = 0, None, None
            for r in recs:
                if cur_e is None or r[0] > cur_e:
                    if cur_e is not None:
                        covered += cur_e - cur_s
                    cur_s, cur_e = r[0], r[1]
                else:
                    cur_e = max(cur_e, r[1])
            covered += cur_e - cur_s
            end = max(r[1] for r in recs)
            per_fn = collections.Counter()
            for r in recs:
                per_fn[f"{r[2]}:{r[3]}"] += (r[1] - r[0]) / 1e3
            rows.append({
                "t": t, "recs": recs, "gpu": g, "end": (end - t) / 1e3,
                "gpu_first": (min(x[0] for x in g) - t) / 1e3 if g else float("nan"),
                "gpu_last": (max(x[1] for x in g) - t) / 1e3 if g else float("nan"),
                "gpu_busy": sum(x[1] - x[0] for x in g) / 1e3,
                "host_outside_api": ((end - t) - covered) / 1e3,
                "per_fn": per_fn,
            })
        if not rows:
            continue
        med = lambda key: statistics.median(r[key] for r in rows)
        print(f"== {name}: {len(rows)} calls; us from the mark (medians): end {med('end'):.1f}, first GPU work "
              f"{med('gpu_first'):.1f}, last GPU work ends {med('gpu_last'):.1f}, GPU busy {med('gpu_busy'):.1f}, "
              f"host outside API calls {med('host_outside_api'):.1f}")
        fns = collections.defaultdict(list)
        for r in rows:
            for fn in set().union(*(x["per_fn"].keys() for x in rows)):
                fns[fn].append(r["per_fn"].get(fn, 0.0))
        for fn, v in sorted(fns.items(), key=lambda x: -statistics.median(x[1])):
            if statistics.median(v) >= 0.05:
                print(f"   api {statistics.median(v):8.1f} us  {fn}")
        gk = collections.defaultdict(list)
        for r in rows:
            per = collections.Counter()
            for x in r["gpu"]:
                per[f"{x[2]}:{short(x[3])}"] += (x[1] - x[0]) / 1e3
            for key in set().union(*(set(f"{x[2]}:{short(x[3])}" for x in rr["gpu"]) for rr in rows)):
                gk[key].append(per.get(key, 0.0))
        for key, v in sorted(gk.items(), key=lambda x: -statistics.median(x[1])):
            print(f"   gpu {statistics.median(v):8.1f} us  {key}")
        ordered = sorted(rows, key=lambda r: r["end"])
        for r in ordered[len(ordered) // 2:len(ordered) // 2 + args.calls]:
            print(f"   -- the call of median length ({r['end']:.1f} us), records from its mark:")
            events = [(x[0], x[1], x[2], x[3]) for x in r["recs"]] + [(x[0], x[1], x[2], short(x[3]) + (" " + x[5] if x[5] else "")) for x in r["gpu"]]
            for s, e, kind, nm in sorted(events):
                print(f"      {(s - r['t']) / 1e3:9.1f} +{(e - s) / 1e3:8.1f}  {kind:8s} {nm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
