#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The public API's overhead table of a gpu-api run (scripts/device/gpu-api.sh): reads the gpu_bench JSON files
api-<side>-<shape>-<round>.json in a folder (side "new" = the tree run, "base" = the base build), prints per
one-query shape the microseconds of kernel-only, kernel-wall, plugin and public calls and the overhead over
kernel-only, then the steps of a resident call; --json writes the medians with the run's context."""
import argparse, collections, glob, json, os, statistics

ORDER = ["textual-1k", "textual-10k", "colpali-rerank", "q128", "visual"]
STEPS = ["step-sync", "step-query-stage", "step-query-check", "step-query-h2d", "step-query-h2d-pageable",
         "step-scores-d2h"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--json", help="write the medians and the context here")
    ap.add_argument("--command", default="bash scripts/device-run.sh gpu-api")
    ap.add_argument("--machine", default="")
    ap.add_argument("--revisions", default="")
    ap.add_argument("--date", default="")
    a = ap.parse_args()
    runs = collections.defaultdict(lambda: collections.defaultdict(list))  # (side, shape) -> mode -> [ms]
    for f in sorted(glob.glob(os.path.join(a.folder, "api-*-*.json"))):
        side = os.path.basename(f).split("-")[1]
        for line in open(f):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            runs[(side, r["shape"])][r["mode"]].append(r["ms"])

    def us(side, shape, mode):
        v = runs[(side, shape)].get(mode)
        return statistics.median(v) * 1000 if v else float("nan")

    shapes = [s for s in ORDER if runs[("new", s)].get("exact")]
    print("microseconds (medians over runs); over = api-resident - exact (kernel-only, calls back to back); "
          "floor = kernel-wall - exact (one synchronisation)")
    print(f"{'shape':15} {'exact':>8} {'k-wall':>8} {'k-wall-map':>10} {'plugin':>8} {'api new':>8} {'api base':>8} "
          f"{'over new':>9} {'over base':>9} {'floor':>6}")
    for s in shapes:
        e = us("new", s, "exact")
        print(f"{s:15} {e:8.1f} {us('new', s, 'kernel-wall'):8.1f} {us('new', s, 'kernel-wall-mapped'):10.1f} "
              f"{us('new', s, 'plugin-resident'):8.1f} {us('new', s, 'api-resident'):8.1f} "
              f"{us('base', s, 'api-resident'):8.1f} {us('new', s, 'api-resident') - e:9.1f} "
              f"{us('base', s, 'api-resident') - us('base', s, 'exact'):9.1f} {us('new', s, 'kernel-wall') - e:6.1f}")
    print("steps (us, synchronous round trips):")
    for s in shapes:
        print(f"  {s:15} " + "  ".join(f"{m[5:]} {us('new', s, m):.1f}" for m in STEPS))
    if a.json:
        rows = []
        for (side, shape), modes in sorted(runs.items()):
            if shape not in shapes:
                continue
            for mode, v in sorted(modes.items()):
                rows.append({"side": side, "shape": shape, "mode": mode, "ms": statistics.median(v),
                             "runs": len(v)})
        ctx = {"command": a.command, "date": a.date, "machine": a.machine, "revisions": a.revisions}
        with open(a.json, "w") as f:
            json.dump({"context": ctx, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
