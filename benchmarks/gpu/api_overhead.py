#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The public API's overhead table of a gpu-api run (scripts/device/gpu-api.sh): reads the gpu_bench JSON files
api-<side>-<shape>-<round>.json in a folder (side "new" = the tree run, "base" = the base build, any other name a
variant: the tree run under other settings), prints per one-query shape the microseconds of kernel-only,
kernel-wall, plugin and public calls and the overhead over kernel-only (per side), then the steps of a resident
call and the batch shapes' matrix against candidate lists; --json writes the medians with the run's context."""
import argparse, collections, glob, json, os, statistics

ORDER = ["textual-1k", "textual-10k", "colpali-rerank", "q128", "visual"]
STEPS = ["step-sync", "step-query-stage", "step-query-check", "step-query-h2d", "step-query-h2d-pageable",
         "step-scores-d2h", "step-pointer-check"]
SERVE = ["serve-textual-10k-64q", "serve-colpali-16q"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--json", help="write the medians and the context here")
    ap.add_argument("--command", default="bash scripts/device-run.sh gpu-api")
    ap.add_argument("--machine", default="")
    ap.add_argument("--revisions", default="")
    ap.add_argument("--date", default="")
    ap.add_argument("--note", default="", help="what the sides are, written into the context as revision_note")
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
            if "fwd_ms" in r:  # the training rows' forward alone
                runs[(side, r["shape"])][r["mode"].replace("fwd+bwd", "fwd")].append(r["fwd_ms"])

    def us(side, shape, mode):
        v = runs[(side, shape)].get(mode)
        return statistics.median(v) * 1000 if v else float("nan")

    shapes = [s for s in ORDER if runs[("new", s)].get("exact")]
    sides = ["new"] + sorted({side for side, _ in runs if side != "new"}, key=lambda x: (x != "base", x))
    print("microseconds (medians over runs); over = api-resident - exact (kernel-only, calls back to back, each side's "
          "own); floor = kernel-wall - exact (one synchronisation)")
    print(f"{'shape':15} {'exact':>8} {'k-wall':>8} {'k-wall-map':>10} {'plugin':>8} {'floor':>6} " +
          " ".join(f"{'api ' + x:>10} {'over ' + x:>10}" for x in sides))
    for s in shapes:
        e = us("new", s, "exact")
        cols = " ".join(f"{us(x, s, 'api-resident'):10.1f} {us(x, s, 'api-resident') - us(x, s, 'exact'):10.1f}"
                        for x in sides)
        print(f"{s:15} {e:8.1f} {us('new', s, 'kernel-wall'):8.1f} {us('new', s, 'kernel-wall-mapped'):10.1f} "
              f"{us('new', s, 'plugin-resident'):8.1f} {us('new', s, 'kernel-wall') - e:6.1f} {cols}")
    print("dense GPU tensors (us): api-dense over dense-kernels per side")
    for s in shapes:
        print(f"  {s:15} " + "  ".join(f"{x} {us(x, s, 'api-dense'):.1f} - {us(x, s, 'dense-kernels'):.1f} = "
                                       f"{us(x, s, 'api-dense') - us(x, s, 'dense-kernels'):.1f}" for x in sides))
    if any(runs[("new", s)].get("api-dense-ordered") for s in shapes):
        print("stream-ordered (us per call: 20 calls back to back, one maxsim_synchronize): api-dense-ordered over "
              "dense-kernels, new")
        for s in shapes:
            o, k = us("new", s, "api-dense-ordered"), us("new", s, "dense-kernels")
            print(f"  {s:15} {o:.1f} - {k:.1f} = {o - k:.1f} ({(o - k) / k * 100:.1f}% of the kernels; synchronous "
                  f"{us('new', s, 'api-dense') - k:.1f})")
    print("steps (us, synchronous round trips, new):")
    for s in shapes:
        print(f"  {s:15} " + "  ".join(f"{m[5:]} {us('new', s, m):.1f}" for m in STEPS))
    serve = [s for s in SERVE if runs[("new", s)].get("plugin-matrix")]
    if serve:
        print("batch shapes (us, the plugin's calls, packed queries in, host scores out): matrix (batch kernel) vs "
              "every document as a candidate list (pair by pair)")
        for s in serve:
            print(f"  {s:22} exact {us('new', s, 'exact'):.1f}  plugin-matrix {us('new', s, 'plugin-matrix'):.1f}  "
                  f"plugin-candidates-all {us('new', s, 'plugin-candidates-all'):.1f}  "
                  f"pointer-check {us('new', s, 'step-pointer-check'):.2f}  " +
                  "  ".join(f"{x}: api {us(x, s, 'api-resident'):.1f} (over {us(x, s, 'api-resident') - us(x, s, 'exact'):.1f}),"
                            f" certified {us(x, s, 'api-resident-certified'):.1f} "
                            f"(over {us(x, s, 'api-resident-certified') - us(x, s, 'exact'):.1f})"
                            for x in sides if runs[(x, s)].get("api-resident")))
    shapes += serve
    train = "train-inbatch"
    if runs[("new", train)].get("api-fwd+bwd-atomic"):
        print("training step (us): the public calls (forward with argmax, then backward) over the plugin's calls "
              "enqueued back to back, per side")
        for kind in ("atomic", "det"):
            print(f"  {'fwd+bwd-' + kind:15} " + "  ".join(
                f"{x} {us(x, train, 'api-fwd+bwd-' + kind):.1f} - {us(x, train, 'fwd+bwd-' + kind):.1f} = "
                f"{us(x, train, 'api-fwd+bwd-' + kind) - us(x, train, 'fwd+bwd-' + kind):.1f}" for x in sides))
        for kind in ("atomic", "det"):
            o, k = us("new", train, f"api-fwd+bwd-{kind}-ordered"), us("new", train, f"fwd+bwd-{kind}")
            if o == o:  # a build with the stream-ordered rows
                print(f"  {'ordered-' + kind:15} new {o:.1f} - {k:.1f} = {o - k:.1f} ({(o - k) / k * 100:.1f}%; "
                      f"20 steps back to back, one maxsim_synchronize)")
        print(f"  {'fwd':15} " + "  ".join(f"{x} {us(x, train, 'api-fwd'):.1f} - {us(x, train, 'fwd-atomic'):.1f} = "
                                          f"{us(x, train, 'api-fwd') - us(x, train, 'fwd-atomic'):.1f}" for x in sides))
        shapes.append(train)
    if a.json:
        rows = []
        for (side, shape), modes in sorted(runs.items()):
            if shape not in shapes:
                continue
            for mode, v in sorted(modes.items()):
                rows.append({"side": side, "shape": shape, "mode": mode, "ms": statistics.median(v),
                             "runs": len(v)})
        ctx = {"command": a.command, "date": a.date, "machine": a.machine, "revisions": a.revisions}
        if a.note:
            ctx["revision_note"] = a.note
        with open(a.json, "w") as f:
            json.dump({"context": ctx, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
