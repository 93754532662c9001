#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""llvm-mca ESTIMATES for the Arm kernels' inner loops (no Arm hardware needed; not measurements).

Compiles the Arm kernel sources exactly as the aarch64 cross build does (its compile_commands.json, with -S and
-DMAXSIM_MCA, which marks one iteration of every tile's k loop: MAXSIM_MCA_BEGIN in kernels/pipeline.h), takes
the region of each kernel's full tile, and runs llvm-mca-19 on it for each CPU model, next to a peak loop of the instruction the tile is built on (FMLA, SDOT, SMMLA:
independent accumulators, so only throughput binds). Prints a Markdown table: cycles per loop iteration,
multiply-adds per cycle and the share of the model's peak for that instruction, cycles per 16 x 16 x 128 block
(16 query x 16 document tokens at d = 128), and GSO/s (2 Lq Ld d per second, docs/benchmarks.md) at an assumed
clock. SVE loops run only on the models of SVE cores, and an SVE instruction counts the multiply-adds of the
model's vector length (SVE_BITS: Neoverse V2 128 bits, Neoverse V1 256, A64FX 512). The loops have no tails at
Lq = 32 (4 query groups of 8) and Ld = 180 or 300 for the exact 2 x 6 tile, and one 4-row i8 tile per document
(counted at the full tile's rate), so the estimate is the same for both Ld; what llvm-mca cannot see (cache
misses, the keys epilogue, selection and refinement in certified mode, the SVE kernels' per-document code
re-layout) is not in it.

  scripts/arm-mca.py [--build build-arm] [--cpus neoverse-v2,neoverse-v1,apple-m4]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# (loop, source file, region name: "tile" + 100 NQ + R, the instruction it is built on)
LOOPS = [
    ("exact (every NEON kernel): FMLA, 2 query groups x 6 rows, per k", "exact_hwy.cc", "tile206", "fmla"),
    ("neon keys: SMULL+SADALP, 2 x 4, per 4 k", "screen_neon.cc", "tile204", "smull"),
    ("neon-dotprod keys: SDOT, 2 x 8, per 16 k", "screen_neon_dotprod.cc", "tile208", "sdot"),
    ("neon-i8mm keys: SMMLA, 2 x 8, per 8 k", "screen_neon_i8mm.cc", "tile208", "smmla"),
    ("exact (sve, sve-i8mm): FMLA by element, 2 query vectors x 8 rows, per 4 k", "exact_sve.cc", "tile208",
     "fmla"),
    ("sve keys: SDOT by element, 2 query groups x 8 vectors, per 16 k", "screen_sve.cc", "tile208", "sdot"),
    ("sve-i8mm keys: SMMLA, 2 query groups x 4 vectors, per 8 k", "screen_sve_i8mm.cc", "tile204", "smmla"),
]
# Multiply-adds per instruction (128-bit forms; an SVE form on z registers: times SVE_BITS / 128).
MACS = {"fmla": 4, "sdot": 16, "smmla": 32, "smull": 8, "smull2": 8}
# Peak loops: 24 independent accumulators per form of the instruction; the peak is the fastest form in the model
# (llvm's models give some by-element forms a higher throughput than the vector form).
PEAK = {
    "fmla": ["fmla v{i}.4s, v30.4s, v31.4s", "fmla v{i}.4s, v{a}.4s, v{b}.s[0]"],
    "smull": ["smull v{i}.8h, v30.8b, v31.8b"],
    "sdot": ["sdot v{i}.4s, v30.16b, v31.16b", "sdot v{i}.4s, v{a}.16b, v{b}.4b[0]"],
    "smmla": ["smmla v{i}.4s, v30.16b, v31.16b"],
}
# The SVE forms (accumulators z8..z31; an indexed operand must be one of z0..z7), on SVE models only.
PEAK_SVE = {
    "fmla": ["fmla z{z}.s, p0/m, z0.s, z1.s", "fmla z{z}.s, z{za}.s, z{zb}.s[0]"],
    "sdot": ["sdot z{z}.s, z0.b, z1.b", "sdot z{z}.s, z{za}.b, z{zb}.b[0]"],
    "smmla": ["smmla z{z}.s, z0.b, z1.b"],
}
SVE_BITS = {"neoverse-v2": 128, "neoverse-v1": 256, "a64fx": 512}
# Assumed clocks: Graviton4-class V2, Graviton3-class V1, M4 performance core, A64FX (Fugaku).
CLOCK_GHZ = {"neoverse-v2": 2.8, "neoverse-v1": 2.6, "apple-m4": 4.4, "a64fx": 2.2}


def compile_asm(build, src, out):
    for c in json.load(open(os.path.join(build, "compile_commands.json"))):
        if c["file"].endswith("/" + src):
            a = shlex.split(c["command"])
            a[a.index("-o") + 1] = out
            a[a.index("-c")] = "-S"
            subprocess.run(a + ["-DMAXSIM_MCA"], check=True, cwd=c["directory"])
            return
    sys.exit(f"arm-mca: {src} is not in {build}/compile_commands.json (configure the aarch64 cross build)")


def region(path, name):
    """The instructions of the first region `name` (one k iteration of that tile)."""
    out, inside = [], False
    for line in open(path):
        t = line.strip()
        if "LLVM-MCA-BEGIN " + name == t.lstrip("#/ ").replace("LLVM-MCA-BEGIN  ", "LLVM-MCA-BEGIN "):
            inside, out = True, []
        elif "LLVM-MCA-END" in t and inside:
            return out
        elif inside and t and not t.startswith((".", "#", "//")) and not re.match(r"^[\w.$]+:", t):
            out.append(t)
    sys.exit(f"arm-mca: no region {name} in {path}")


def mca(asm_lines, cpu):
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write("\n".join(asm_lines) + "\n")
        path = f.name
    try:
        out = subprocess.run(["llvm-mca-19", "-mtriple=aarch64-linux-gnu", f"-mcpu={cpu}", "-iterations=500", path],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    it = int(re.search(r"Iterations:\s+(\d+)", out).group(1))
    cyc = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1))
    return cyc / it


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-arm")
    ap.add_argument("--cpus", default="neoverse-v2,neoverse-v1,apple-m4")
    args = ap.parse_args()
    cpus = args.cpus.split(",")
    tmp = tempfile.mkdtemp()

    def peak_of(forms, macs, cpu):
        return max(24 * macs / mca([f.format(i=i, a=24 + i % 4, b=28 + i % 3, z=8 + i, za=2 + i % 3, zb=5 + i % 3)
                                     for i in range(24)], cpu) for f in forms)

    peaks = {(ins, cpu, False): peak_of(PEAK[ins], MACS[ins], cpu) for ins in PEAK for cpu in cpus}
    peaks.update({(ins, cpu, True): peak_of(PEAK_SVE[ins], MACS[ins] * SVE_BITS[cpu] // 128, cpu)
                  for ins in PEAK_SVE for cpu in cpus if cpu in SVE_BITS})
    print("| loop | CPU model | instrs/iter | cycles/iter | MAC/cycle | % of model peak | cycles per 16x16x128 | "
          "GSO/s at Lq=32, Ld=180 and 300 (one core, assumed clock) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for label, src, pattern, ins in LOOPS:
        asm = os.path.join(tmp, src + ".s")
        compile_asm(args.build, src, asm)
        loop = region(asm, pattern)
        sve = any(" z" in l for l in loop)
        for cpu in cpus:
            if sve and cpu not in SVE_BITS:
                continue
            widen = SVE_BITS.get(cpu, 128) // 128
            macs = sum(MACS.get(l.split()[0], 0) * (widen if " z" in l else 1) for l in loop)
            cyc = mca(loop, cpu)
            rate = macs / cyc
            peak = peaks[(ins, cpu, sve)]
            pct = 100 * rate / peak
            block = 16 * 16 * 128 / rate
            gso = 2 * rate * CLOCK_GHZ.get(cpu, 3.0)
            model = f"{cpu} ({SVE_BITS[cpu]}-bit SVE)" if sve else cpu
            print(f"| {label} | {model} | {len(loop)} | {cyc:.2f} | {rate:.1f} | {pct:.0f}% of {ins.upper()} "
                  f"({peak:.0f}) | {block:.0f} | {gso:.0f} at {CLOCK_GHZ.get(cpu, 3.0)} GHz |")


if __name__ == "__main__":
    main()
