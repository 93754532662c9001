#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Nsight Compute profiles side by side: one column per profiled kernel, as a markdown table.

    python3 benchmarks/gpu/ncu_compare.py [--json OUT.json] NAME=RAW.csv[,SASS.csv] ...

RAW.csv is `ncu --import R.ncu-rep --page raw --csv` (one row per profiled kernel; the first is used) and SASS.csv
`ncu --import R.ncu-rep --page source --csv --print-source sass`. Prints the launch shape, time, SM activity (the
average, least and most active SM: how early some SMs run out of work), DRAM and L2 traffic, occupancy and
warp-stall figures of each, then per SASS opcode the instructions executed (load widths, copies, matrix
instructions), so that two kernels over the same bytes can be compared line by line. --json also writes those
figures, one object per profile (name, metrics by label, stalls, opcodes).
"""
import json
import csv
import re
import sys

# (label, metric name); a missing metric prints "-".
ROWS = [
    ("kernel", "Kernel Name"),
    ("grid", "launch__grid_size"),
    ("block threads", "launch__block_size"),
    ("registers / thread", "launch__registers_per_thread"),
    ("dynamic smem / block", "launch__shared_mem_per_block_dynamic"),
    ("static smem / block", "launch__shared_mem_per_block_static"),
    ("blocks / SM (theoretical)", "launch__occupancy_limit_shared_mem"),
    ("waves / SM", "launch__waves_per_multiprocessor"),
    ("duration", "gpu__time_duration.sum"),
    ("elapsed cycles", "gpc__cycles_elapsed.max"),
    ("SM clock", "sm__cycles_elapsed.avg.per_second"),
    ("DRAM clock", "dram__cycles_elapsed.avg.per_second"),
    ("L2 clock", "lts__cycles_elapsed.avg.per_second"),
    ("SM active cycles, avg", "sm__cycles_active.avg"),
    ("SM active cycles, min", "sm__cycles_active.min"),
    ("SM active cycles, max", "sm__cycles_active.max"),
    ("DRAM read bytes", "dram__bytes_read.sum"),
    ("DRAM write bytes", "dram__bytes_write.sum"),
    ("DRAM throughput % of peak", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L2 read sectors from L1/TEX", "lts__t_sectors_srcunit_tex_op_read.sum"),
    ("L2 hit rate %", "lts__t_sector_hit_rate.pct"),
    ("L1/TEX hit rate %", "l1tex__t_sector_hit_rate.pct"),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("theoretical occupancy %", "sm__maximum_warps_per_active_cycle_pct"),
    ("eligible warps / scheduler", "smsp__warps_eligible.avg.per_cycle_active"),
    ("issued IPC (per SM)", "sm__inst_executed.avg.per_cycle_active"),
    ("instructions executed", "smsp__inst_executed.sum"),
    ("warp cycles per issued instruction", "smsp__average_warp_latency_per_inst_issued.ratio"),
]
# Warp-stall reasons (cycles per issued instruction), the largest shown.
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def read_raw(path):
    with open(path, newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hdr is None or hdr + 2 >= len(rows):
        return {}
    names, units, data = rows[hdr], rows[hdr + 1], rows[hdr + 2]  # the row after the header holds the units
    return {n: (f"{v} {u}" if u and num(v) is not None else v) for n, u, v in zip(names, units, data)}


def opcodes(path):
    """Instructions executed per SASS opcode (with its width/cache modifiers) from a source-page CSV."""
    try:
        with open(path, newline="", errors="replace") as f:
            rows = list(csv.reader(f))
    except OSError:
        return {}
    hdr = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if hdr is None:
        return {}
    h = rows[hdr]
    src = h.index("Source")
    ex = next((i for i, c in enumerate(h) if c.startswith("Instructions Executed")), None)
    out = {}
    for r in rows[hdr + 1:]:
        if len(r) != len(h):
            continue
        text = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip())
        op = text.split(" ")[0] if text else ""
        if not op:
            continue
        try:
            n = float(r[ex].replace(",", "")) if ex is not None else 1.0
        except ValueError:
            n = 0.0
        out[op] = out.get(op, 0.0) + n
    return out


def num(v):
    """The number at the start of a metric value ("1,234.5 usecond" -> 1234.5), or None."""
    try:
        return float(v.split(" ")[0].replace(",", ""))
    except (AttributeError, ValueError, IndexError):
        return None


def main():
    cols = []
    args = sys.argv[1:]
    json_out = None
    if len(args) >= 2 and args[0] == "--json":
        json_out, args = args[1], args[2:]
    for arg in args:
        name, _, files = arg.partition("=")
        raw, _, sass = files.partition(",")
        cols.append((name, read_raw(raw), opcodes(sass) if sass else {}))
    if not cols:
        print(__doc__)
        return 1
    print("| metric | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label, metric in ROWS:
        vals = [c[1].get(metric, "-") for c in cols]
        if metric == "Kernel Name":
            vals = [v[:40] for v in vals]
        print(f"| {label} | " + " | ".join(vals) + " |")
    stalls = {}
    for _, m, _ in cols:
        for k, v in m.items():
            s = STALL.match(k)
            if s and num(v) is not None:
                stalls[s.group(1)] = max(stalls.get(s.group(1), 0.0), num(v))
    for reason in sorted(stalls, key=lambda r: -stalls[r])[:8]:
        metric = f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
        print(f"| stall {reason} (cycles / issue) | " + " | ".join(c[1].get(metric, "-") for c in cols) + " |")
    ops = {}
    for _, _, o in cols:
        for k, v in o.items():
            ops[k] = max(ops.get(k, 0.0), v)
    if ops:
        print()
        print("| SASS opcode (instructions executed) | " + " | ".join(c[0] for c in cols) + " |")
        print("|---|" + "---:|" * len(cols))
        for op in sorted(ops, key=lambda k: -ops[k])[:30]:
            print(f"| {op} | " + " | ".join(f"{c[2].get(op, 0):.0f}" for c in cols) + " |")
    if json_out:
        with open(json_out, "w") as f:
            json.dump([{"profile": name, "metrics": {label: m.get(metric) for label, metric in ROWS},
                        "stalls": {r: num(m.get(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"))
                                   for r in stalls},
                        "opcodes": {k: round(v) for k, v in sorted(o.items(), key=lambda x: -x[1])[:40]}}
                       for name, m, o in cols], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
