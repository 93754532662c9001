# SPDX-License-Identifier: Apache-2.0
"""Shared pieces of the Python benchmarks: timing (median of interleaved rounds), the machine description and the
result file (JSON with the command, machine, date and load, written by temp + rename)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from typing import Callable


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores_online": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
            "loadavg_1m": os.getloadavg()[0]}


def time_calls(fns: dict[str, Callable[[], object]], min_time: float = 0.2, rounds: int = 7) -> dict[str, list[float]]:
    """Seconds per call of each function in each round, rounds interleaved across functions (drift and other
    processes' load hit all alike). summary() turns a list into median and spread."""
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    reps = {}
    for name, fn in fns.items():  # warm up and size the repetitions to ~min_time per round
        fn()
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        reps[name] = max(1, int(min_time / one))
    for _ in range(rounds):
        for name, fn in fns.items():
            n = reps[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            per_call[name].append((time.perf_counter() - t0) / n)
    return per_call


def summary(values: list[float], scale: float = 1e6) -> dict:
    """Median, quartiles, min and max of per-round values (seconds), in microseconds by default."""
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return {"median": statistics.median(v) * scale, "p25": q[0] * scale, "p75": q[2] * scale,
            "min": v[0] * scale, "max": v[-1] * scale, "rounds": len(v)}


LOAD_AT_START = os.getloadavg()


def write_result(path: str, payload: dict) -> None:
    """Writes the result with the command, date, machine and the 1/5/15-minute load averages at the start of the
    run and at its end (the machine may be shared: read the ratios with the load)."""
    payload = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "date_utc":
               time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
               "loadavg_at_start": list(LOAD_AT_START), "loadavg_at_end": list(os.getloadavg()), **payload}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
