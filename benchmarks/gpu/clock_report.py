#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GPU's clocks and power per benchmark row (scripts/device/gpu-clock.sh).

Usage: clock_report.py SMI_CSV ROWS_TXT...

SMI_CSV: nvidia-smi --query-gpu=timestamp,clocks.sm,...  --format=csv,nounits -lms N (one sample per line).
ROWS_TXT: maxsim_gpu_bench's stdout, each line prefixed with the local time it was printed
("YYYY/MM/DD HH:MM:SS.mmm"), after a first line "# calls N" (its MAXSIM_GPU_BENCH_ITERS). A row line ("SHAPE MODE
MS ms ...") ends the row, whose N timed calls took about T = N x MS and ended shortly before the line (gpu_bench
then frees the calls' events and takes the median); the samples from T before the line to a tenth of T before it,
less the first tenth, are the row's own. read-same-bytes is a sweep of read variants at their own counts, not N
calls, and is left out.
Prints per row: how long it ran, the samples, the median SM clock (and its range), the median power, and the
clock-event reasons seen (nvidia-smi's bit mask; 0x1 idle, 0x4 software power cap, 0x8 hardware slowdown, ...).
"""
import csv
import datetime
import re
import statistics
import sys

FMT = "%Y/%m/%d %H:%M:%S.%f"


def stamp(text):
    return datetime.datetime.strptime(text.strip(), FMT).timestamp()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        table = [r for r in csv.reader(f) if r]
    if not table:
        sys.exit(f"clock_report.py: no nvidia-smi samples in {sys.argv[1]}")
    head = [c.strip().split(" [")[0] for c in table[0]]
    samples = []
    for r in table[1:]:
        if len(r) != len(head):
            continue
        try:
            t = stamp(r[0])
        except ValueError:
            continue
        row = {"t": t}
        for name, v in zip(head[1:], r[1:]):
            row[name] = v.strip()
        samples.append(row)
    print(f"{len(samples)} nvidia-smi samples ({', '.join(head[1:])})")
    # nvidia-smi names its columns (clocks.current.sm, ...) other than the query's fields (clocks.sm, ...).
    def column(*parts):
        return next((h for h in head if all(p in h for p in parts)), "")
    sm_col = column("clocks", ".sm")
    power = column("power.draw.instant") or column("power.draw")
    reasons = column("reasons")
    print(f"{'shape':<16} {'row':<28} {'ms':>8} {'s':>5} {'n':>4} {'SM MHz':>7} {'range':>11} {'W':>6}  reasons")
    for path in sys.argv[2:]:
        prev, calls = None, 0
        for line in open(path, errors="replace"):
            if line.startswith("# calls "):
                try:
                    calls = int(line.split()[2])
                except (IndexError, ValueError):
                    sys.exit(f"clock_report.py: {path}: '{line.strip()}' is not '# calls N'")
                continue
            m = re.match(r"(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) (.*)$", line.rstrip("\n"))
            if not m:
                continue
            t, text = stamp(m.group(1)), m.group(2)
            row = re.match(r"(\S+)\s+(\S+)\s+([0-9.]+) ms", text)
            if row and prev is not None and calls > 0 and row.group(2) != "read-same-bytes":
                loop = calls * float(row.group(3)) / 1000.0
                lo, hi = t - 0.9 * loop, t - 0.1 * loop
                own = [s for s in samples if lo <= s["t"] <= hi]
                def num(key):
                    out = []
                    for s in own:
                        try:
                            out.append(float(s[key]))
                        except (KeyError, ValueError):
                            pass
                    return out
                clk, pw = num(sm_col), num(power)
                why = sorted({s.get(reasons, "?") for s in own})
                label = f"{row.group(1):<16} {row.group(2):<28} {float(row.group(3)):8.4f} {hi - lo:5.2f} {len(own):4d}"
                if clk:
                    watts = statistics.median(pw) if pw else float("nan")
                    print(f"{label} {statistics.median(clk):7.0f} {min(clk):5.0f}-{max(clk):5.0f} {watts:6.1f}  "
                          f"{' '.join(why)}")
                else:
                    print(f"{label}  (no clock)")
            prev = t


if __name__ == "__main__":
    main()
