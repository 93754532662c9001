#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libmaxsim's public C API against the Triton MaxSim peers, on the same GPU tensors, in one process per shape.

    python3 benchmarks/gpu/peers.py --lib build/libmaxsim.so --json out.json           # every shape, each in
                                                                                      # a fresh child process
    python3 benchmarks/gpu/peers.py --lib build/libmaxsim.so --shape visual --json -   # one shape, here

Implementations (each on the same bf16 torch tensors, d = 128, unit-norm Gaussian tokens):
  libmaxsim             maxsim_score_matrix through ctypes (the public C API) with MAXSIM_MEMORY_CUDA dense sets,
                        device scores out, EXACT mode, on torch's current stream (training: with argmax, then
                        maxsim_backward, atomic and deterministic)
  libmaxsim-py          the Python binding (the maxsim package; it loads the CUDA plugin beside --lib unless
                        MAXSIM_PLUGIN_PATH is set): maxsim.scores(Q, D), which returns a new torch tensor, and
                        libmaxsim-py-ordered the same with stream_ordered=True (returns once enqueued); training:
                        maxsim.torch.maxsim(Q, D) with autograd's backward, atomic (libmaxsim-py-atomic),
                        deterministic (libmaxsim-py-det), and atomic with stream_ordered=True (libmaxsim-py-ordered).
                        Each scoring row says whether its scores have the bits of the ctypes call's (same_bits)
  lik                   late-interaction-kernels: maxsim(Q, D) (training: autograd backward)
  flash                 flash-maxsim: flash_maxsim_batched(Q, D) (Nq = 1: also flash_maxsim(Q[0], D));
                        training: flash_maxsim_batched_train(Q, D) + autograd backward
Whichever peer package is not importable is reported as missing, not skipped silently.
MAXSIM_PEERS_IMPLS (a comma-separated subset of libmaxsim,libmaxsim-py,lik,flash; default all) limits the
implementations run,
and MAXSIM_PEERS_LIB_TAG is appended to libmaxsim's C API row names (a build variant selected by the environment;
not to the binding's rows, which report.py reads by name). The binding's rows name the libmaxsim shared objects
the process had mapped (libmaxsim_loaded): the ctypes rows load --lib first, and a library of the same soname
then serves the binding's extension too.
Each peer row names the launch configuration its Triton autotuner chose ("configs").

    ncu --profile-from-start off ... python3 benchmarks/gpu/peers.py --lib L --shape textual-1k --profile lik --json -
runs one implementation's call (lik, flash, flash-single, libmaxsim or libmaxsim-py) a few times after warming up, between
cudaProfilerStart and cudaProfilerStop, for a profiler (scripts/device/gpu-ncu.sh, NCU_PEERS).

Per implementation and shape:
  e2e_ms        median wall time of one call from Python, host clock, the device synchronised after it (what a
                caller waits for; libmaxsim's call already returns after its stream finished)
  device_ms     median of CUDA-event intervals around calls enqueued back to back (do_bench style)
  kernel_ms     the sum of GPU kernel durations per call from the PyTorch profiler (CUPTI), and per kernel name
  check_ms      libmaxsim only: the part of kernel_ms spent in input-check kernels (names containing "Check")
  rel_err       max |score - ref| / max |ref| against a float64 reference of the same tensors
Inputs rotate among copies of D (and Q), more than 200 MB in all (up to 32 copies), so that repeated calls read HBM,
not L2.
Writes one JSON object per line (shape, impl, the fields above); report.py prints the ratios.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {
    # name: (Nq, Lq, Nd, Ld)
    "textual-100": (1, 32, 100, 300),
    "colpali-100": (1, 32, 100, 1030),
    "textual-1k": (1, 32, 1000, 300),
    "textual-10k": (1, 32, 10000, 300),
    "colpali-rerank": (1, 32, 1000, 1030),
    "q128": (1, 128, 1000, 1030),
    "visual": (1, 1024, 1000, 1024),
    "serve-textual-10k-64q": (64, 32, 10000, 300),
    "serve-colpali-16q": (16, 32, 1000, 1030),
    "train-inbatch": (64, 32, 64, 300),
}
DIM = 128


# ---- libmaxsim through ctypes (maxsim.h) ---------------------------------------------------------------------

class DenseSets(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("memory", ctypes.c_int32), ("data", ctypes.c_void_p),
                ("dtype", ctypes.c_int32), ("dim", ctypes.c_uint32), ("row_stride", ctypes.c_uint64),
                ("n_sets", ctypes.c_uint64), ("offsets", ctypes.c_void_p), ("set_length", ctypes.c_uint64),
                ("mask", ctypes.c_void_p)]


class Sets(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("dense", ctypes.POINTER(DenseSets))]


class ScoreOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("metric", ctypes.c_int32), ("mode", ctypes.c_int32),
                ("stats", ctypes.c_void_p), ("cuda_stream", ctypes.c_void_p), ("flags", ctypes.c_uint32)]


class Options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_threads", ctypes.c_int32), ("backend", ctypes.c_char_p),
                ("isa", ctypes.c_char_p), ("plugin_path", ctypes.c_char_p), ("load_plugins", ctypes.c_uint32),
                ("log", ctypes.c_void_p), ("log_user_data", ctypes.c_void_p), ("devices", ctypes.c_char_p)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("layout", ctypes.c_int32), ("cand_offsets", ctypes.c_void_p),
                ("candidates", ctypes.c_void_p), ("argmax", ctypes.c_void_p), ("grad_scores", ctypes.c_void_p),
                ("grad_queries", ctypes.c_void_p), ("grad_documents", ctypes.c_void_p),
                ("deterministic", ctypes.c_int32), ("cuda_stream", ctypes.c_void_p), ("flags", ctypes.c_uint32)]


MAXSIM_MEMORY_CUDA, MAXSIM_BF16 = 1, 3


class LibMaxsim:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.maxsim_last_error.restype = ctypes.c_char_p
        L.maxsim_context_create.argtypes = [ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_void_p)]
        L.maxsim_score_matrix.argtypes = [ctypes.c_void_p, ctypes.POINTER(Sets), ctypes.POINTER(Sets),
                                          ctypes.POINTER(ScoreOptions), ctypes.c_void_p, ctypes.c_void_p]
        L.maxsim_backward.argtypes = [ctypes.c_void_p, ctypes.POINTER(DenseSets), ctypes.POINTER(DenseSets),
                                      ctypes.POINTER(BackwardArgs)]
        L.maxsim_context_backend.restype = ctypes.c_char_p
        L.maxsim_context_backend.argtypes = [ctypes.c_void_p]
        o = Options()
        self.init(o, "maxsim_options_init")
        o.backend = b"cuda"
        self.ctx = ctypes.c_void_p()
        self.check(L.maxsim_context_create(ctypes.byref(o), ctypes.byref(self.ctx)), "maxsim_context_create")
        self.backend = L.maxsim_context_backend(self.ctx).decode()

    def init(self, struct, name):
        """Defaults into the whole ctypes struct: NAME_sized with its size (the exported NAME fills the first layout
        only, maxsim.h); a library from before the sized inits has only NAME, which fills its whole struct."""
        sized = getattr(self.lib, name + "_sized", None)
        if sized is None:
            getattr(self.lib, name)(ctypes.byref(struct))
        else:
            sized(ctypes.byref(struct), ctypes.c_size_t(ctypes.sizeof(struct)))

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {self.lib.maxsim_last_error().decode()}")

    @staticmethod
    def dense(t):
        """A [N, L, d] bf16 CUDA tensor as maxsim_dense_sets (uniform lengths)."""
        assert t.is_cuda and t.is_contiguous() and t.dim() == 3
        s = DenseSets()
        s.struct_size = ctypes.sizeof(DenseSets)
        s.memory = MAXSIM_MEMORY_CUDA
        s.data = t.data_ptr()
        s.dtype = MAXSIM_BF16
        s.dim = t.shape[2]
        s.n_sets = t.shape[0]
        s.set_length = t.shape[1]
        return s

    def score_matrix(self, q, d, scores, argmax=None, stream=0):
        qs, ds = self.dense(q), self.dense(d)
        qa, da = Sets(None, ctypes.pointer(qs)), Sets(None, ctypes.pointer(ds))
        o = ScoreOptions()
        self.init(o, "maxsim_score_options_init")
        o.cuda_stream = stream
        self.check(self.lib.maxsim_score_matrix(self.ctx, ctypes.byref(qa), ctypes.byref(da), ctypes.byref(o),
                                                scores.data_ptr(), argmax.data_ptr() if argmax is not None else None),
                   "maxsim_score_matrix")

    def backward(self, q, d, argmax, grad, gq, gd, deterministic, stream=0):
        qs, ds = self.dense(q), self.dense(d)
        a = BackwardArgs()
        a.struct_size = ctypes.sizeof(BackwardArgs)
        a.layout = 0  # MAXSIM_LAYOUT_MATRIX
        a.argmax = argmax.data_ptr()
        a.grad_scores = grad.data_ptr()
        a.grad_queries = gq.data_ptr()
        a.grad_documents = gd.data_ptr()
        a.deterministic = deterministic
        a.cuda_stream = stream
        self.check(self.lib.maxsim_backward(self.ctx, ctypes.byref(qs), ctypes.byref(ds), ctypes.byref(a)),
                   "maxsim_backward")


# ---- measurement ---------------------------------------------------------------------------------------------

def unit(torch, shape, gen):
    x = torch.randn(*shape, device="cuda", dtype=torch.float32, generator=gen)
    return (x / x.norm(dim=-1, keepdim=True)).to(torch.bfloat16).contiguous()


def reference(torch, q, d):
    """float64 MaxSim scores [Nq, Nd] of bf16 tensors, in document chunks."""
    q64 = q.double()
    out = []
    step = max(1, (1 << 27) // max(1, q.shape[0] * q.shape[1] * d.shape[1]))
    for j in range(0, d.shape[0], step):
        s = torch.einsum("qsh,nth->qnst", q64, d[j:j + step].double())
        out.append(s.amax(-1).sum(-1))
    return torch.cat(out, dim=1)


def time_call(torch, fn, n_inputs, warm=5, iters=30):
    """(e2e median ms, device median ms): host clock with a synchronise after each call, and CUDA events
    around calls enqueued back to back."""
    for i in range(warm):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    e2e = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(i % n_inputs)
        torch.cuda.synchronize()
        e2e.append((time.perf_counter() - t0) * 1e3)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i in range(iters):
        ev[i][0].record()
        fn(i % n_inputs)
        ev[i][1].record()
    torch.cuda.synchronize()
    dev = [a.elapsed_time(b) for a, b in ev]
    return statistics.median(e2e), statistics.median(dev)


def kernel_time(torch, fn, n_inputs, iters=20):
    """Sum of GPU kernel durations per call (ms) from the profiler's trace, and per kernel name."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            fn(i % n_inputs)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    by_name = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel" and "dur" in e:
            by_name[e["name"]] = by_name.get(e["name"], 0.0) + float(e["dur"]) / 1e3 / iters
    return sum(by_name.values()), by_name


def triton_configs(package):
    """The launch configuration each Triton autotuner of a package's loaded modules chose, by kernel name."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return {}
    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(package):
            continue
        for attr, v in list(vars(mod).items()):
            if isinstance(v, Autotuner) and getattr(v, "best_config", None) is not None:
                found[f"{mod_name}.{attr}"] = str(v.best_config)
    return found


def loaded_libmaxsim():
    """The libmaxsim shared objects this process has mapped (/proc/self/maps): a library loaded by soname once
    (libmaxsim.so.0) serves every later loader, the binding's extension included."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libmaxsim.so" in line and "/" in line})
    except OSError:
        return []


def run_binding(torch, name, nq, lq, nd, Qs, Ds, lib_path, gen, train, lib, stream, measure, emit):
    """The libmaxsim-py rows: the maxsim package on the shape's tensors. A failure outside a timed call is
    reported as an error row, and the peers' rows still run."""
    os.environ.setdefault("MAXSIM_PLUGIN_PATH", os.path.dirname(os.path.abspath(lib_path)))
    try:
        import maxsim
        import maxsim.torch as mtorch
        where = {"version": maxsim.__version__, "module": os.path.dirname(maxsim.__file__),
                 "backend": maxsim.info(backend="cuda")["backend"], "libmaxsim_loaded": loaded_libmaxsim()}
    except Exception as e:
        emit("libmaxsim-py", error=f"not usable: {type(e).__name__}: {str(e)[:300]}")
        return
    try:
        if not train:
            # The ctypes call's scores on the first copy, for the bits check.
            want = None
            if lib is not None and lib.backend == "cuda":
                want = torch.empty(nq, nd, device="cuda", dtype=torch.float32)
                lib.score_matrix(Qs[0], Ds[0], want, stream=stream)
                torch.cuda.synchronize()
            for ordered in (False, True):
                res = {}
                def f(i, ordered=ordered):
                    res["s"] = maxsim.scores(Qs[i], Ds[i], stream_ordered=ordered)
                extra = dict(where)
                if want is not None:
                    f(0)
                    torch.cuda.synchronize()
                    extra["same_bits"] = int(torch.equal(res["s"].reshape(want.shape).view(torch.int32),
                                                         want.view(torch.int32)))
                measure("libmaxsim-py" + ("-ordered" if ordered else ""), f, result=lambda: res["s"], extra=extra)
            maxsim.synchronize()  # the stream-ordered rows' deferred errors, if any, raise here
            return
        grad = torch.randn(nq, nd, device="cuda", generator=gen)
        qg = [q.detach().clone().requires_grad_(True) for q in Qs]
        dg = [d.detach().clone().requires_grad_(True) for d in Ds]
        for impl, det, ordered in (("atomic", False, False), ("det", True, False), ("ordered", False, True)):
            def step(i, det=det, ordered=ordered):
                s = mtorch.maxsim(qg[i], dg[i], deterministic=det, stream_ordered=ordered)
                s.backward(grad)
            measure("libmaxsim-py-" + impl, step, extra=where)
        maxsim.synchronize()
    except Exception as e:  # reported as a row, never hidden; the peers still run
        emit("libmaxsim-py", error=f"{type(e).__name__}: {str(e)[:300]}")


def run_shape(name, lib_path, out, profile=None):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    nq, lq, nd, ld = SHAPES[name]
    train = name.startswith("train")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    d_bytes = nd * ld * DIM * 2
    copies = 1 if train else max(1, min(32, (200 << 20) // d_bytes + 1))  # gpu_bench's rotation
    Qs = [unit(torch, (nq, lq, DIM), gen) for _ in range(copies)]
    Ds = [unit(torch, (nd, ld, DIM), gen) for _ in range(copies)]
    ref = None if train else reference(torch, Qs[0], Ds[0])
    dev = torch.cuda.get_device_name()

    def emit(impl, **kw):
        if impl.startswith("libmaxsim") and not impl.startswith("libmaxsim-py"):
            impl += os.environ.get("MAXSIM_PEERS_LIB_TAG", "")
        rec = {"shape": name, "impl": impl, "nq": nq, "lq": lq, "nd": nd, "ld": ld, "dim": DIM, "device": dev}
        rec.update(kw)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        brief = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in kw.items() if k != "kernels"}
        print(name, impl, brief, flush=True)

    def measure(impl, fn, result=None, extra=None, tuned=None):
        """Times fn (or, with --profile, runs it for the profiler); tuned: the package whose Triton autotuners'
        choices the row names, read after the calls."""
        extra = dict(extra or {})
        if profile is not None:
            if impl == profile:
                for i in range(5):
                    fn(i % copies)
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                for i in range(3):
                    fn(i % copies)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                if tuned:
                    extra["configs"] = triton_configs(tuned)
                emit(impl, profiled_calls=3, **extra)
            return
        try:
            e2e, devms = time_call(torch, fn, copies)
            kms, kernels = kernel_time(torch, fn, copies)
            rec = {"e2e_ms": e2e, "device_ms": devms, "kernel_ms": kms,
                   "kernels": {k: round(v, 5) for k, v in sorted(kernels.items(), key=lambda x: -x[1])[:8]}}
            if impl.startswith("libmaxsim"):
                rec["check_ms"] = sum(v for k, v in kernels.items() if "Check" in k)
            if result is not None and ref is not None:
                fn(0)
                torch.cuda.synchronize()
                r = result().double().reshape(ref.shape)
                rec["rel_err"] = float((r - ref).abs().max() / ref.abs().max())
            rec.update(extra)
            if tuned:
                rec["configs"] = triton_configs(tuned)
            emit(impl, **rec)
        except Exception as e:  # a peer's failure is reported as a row, never hidden
            emit(impl, error=f"{type(e).__name__}: {str(e)[:300]}")

    stream = torch.cuda.current_stream().cuda_stream
    impls = set(os.environ.get("MAXSIM_PEERS_IMPLS", "libmaxsim,libmaxsim-py,lik,flash").split(","))
    if profile is not None:
        impls = {"libmaxsim-py" if profile.startswith("libmaxsim-py") else profile.split("-")[0]}
    # libmaxsim, public C API.
    lib = None
    try:
        if "libmaxsim" in impls:
            lib = LibMaxsim(lib_path)
    except Exception as e:
        emit("libmaxsim", error=f"{type(e).__name__}: {str(e)[:300]}")
    if lib is not None:
        if lib.backend != "cuda":
            emit("libmaxsim", error=f"backend is {lib.backend}, not cuda")
        elif not train:
            scores = torch.empty(nq, nd, device="cuda", dtype=torch.float32)
            measure("libmaxsim", lambda i: lib.score_matrix(Qs[i], Ds[i], scores, stream=stream),
                    result=lambda: scores)
        else:
            scores = torch.empty(nq, nd, device="cuda", dtype=torch.float32)
            argmax = torch.empty(nq, nd, lq, device="cuda", dtype=torch.int32)
            grad = torch.randn(nq, nd, device="cuda", generator=gen)
            gq = torch.empty(nq, lq, DIM, device="cuda", dtype=torch.float32)
            gd = torch.empty(nd, ld, DIM, device="cuda", dtype=torch.float32)
            for det in (0, 1):
                def step(i, det=det):
                    lib.score_matrix(Qs[i], Ds[i], scores, argmax, stream=stream)
                    lib.backward(Qs[i], Ds[i], argmax, grad, gq, gd, det, stream=stream)
                measure("libmaxsim-" + ("det" if det else "atomic"), step)
            measure("libmaxsim-fwd", lambda i: lib.score_matrix(Qs[i], Ds[i], scores, argmax, stream=stream))

    # libmaxsim's Python binding, on the same tensors (and the same plugin as the ctypes rows).
    if "libmaxsim-py" in impls:
        run_binding(torch, name, nq, lq, nd, Qs, Ds, lib_path, gen, train, lib, stream, measure, emit)

    def peer(impl, module):
        """The peer's module, or None (not asked for, or not importable: reported as a row)."""
        if impl not in impls:
            return None, None
        try:
            m = __import__(module)
            return m, getattr(m, "__version__", "?")
        except Exception as e:
            emit(impl, error=f"not importable: {type(e).__name__}: {str(e)[:200]}")
            return None, None

    # late-interaction-kernels.
    lik, ver = peer("lik", "late_interaction_kernels")
    if lik is not None:
        if not train:
            res = {}
            def f(i):
                res["s"] = lik.maxsim(Qs[i], Ds[i])
            measure("lik", f, result=lambda: res["s"], extra={"version": ver}, tuned="late_interaction")
        else:
            grad = torch.randn(nq, nd, device="cuda", generator=gen)
            qg = [q.detach().clone().requires_grad_(True) for q in Qs]
            dg = [d.detach().clone().requires_grad_(True) for d in Ds]
            def step(i):
                s = lik.maxsim(qg[i], dg[i])
                s.backward(grad)
            measure("lik", step, extra={"version": ver})
            with torch.no_grad():
                measure("lik-fwd", lambda i: lik.maxsim(Qs[i], Ds[i]), extra={"version": ver})
    # flash-maxsim.
    fm, ver = peer("flash", "flash_maxsim")
    if fm is not None:
        if not train:
            res = {}
            def fb(i):
                res["s"] = fm.flash_maxsim_batched(Qs[i], Ds[i])
            measure("flash", fb, result=lambda: res["s"],
                    extra={"version": ver, "entry": "flash_maxsim_batched"}, tuned="flash_maxsim")
            if nq == 1:
                def f1(i):
                    res["s"] = fm.flash_maxsim(Qs[i][0], Ds[i])
                measure("flash-single", f1, result=lambda: res["s"],
                        extra={"version": ver, "entry": "flash_maxsim"}, tuned="flash_maxsim")
        else:
            grad = torch.randn(nq, nd, device="cuda", generator=gen)
            qg = [q.detach().clone().requires_grad_(True) for q in Qs]
            dg = [d.detach().clone().requires_grad_(True) for d in Ds]
            def step(i):
                s = fm.flash_maxsim_batched_train(qg[i], dg[i])
                s.backward(grad)
            measure("flash", step, extra={"version": ver, "entry": "flash_maxsim_batched_train"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path to libmaxsim.so (its folder holds the CUDA plugin)")
    ap.add_argument("--json", required=True, help="output file (one JSON object per line), '-' for stdout")
    ap.add_argument("--shape", help="one shape, in this process; default: every shape, each in a child process")
    ap.add_argument("--shapes", default=" ".join(SHAPES),
                    help="shapes for the child processes, separated by spaces or commas")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per shape (Triton autotuning included)")
    ap.add_argument("--profile", help="with --shape: run only this implementation's call (lik, flash, flash-single, "
                    "libmaxsim or libmaxsim-py), 3 times between cudaProfilerStart and cudaProfilerStop after 5 warm-up calls")
    args = ap.parse_args()
    shapes = args.shapes.replace(",", " ").split()
    unknown = [n for n in ([args.shape] if args.shape else shapes) if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shape {unknown[0]!r}; the shapes are: {' '.join(SHAPES)}")
    if args.shape:
        out = sys.stdout if args.json == "-" else open(args.json, "a")
        run_shape(args.shape, args.lib, out, args.profile)
        return 0
    open(args.json, "w").close()
    status = 0
    for name in shapes:
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, "--lib", args.lib, "--json", args.json, "--shape", name],
                               timeout=args.timeout)
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"peers: {name}: rc {rc} in {time.time() - t0:.0f} s", flush=True)
        if rc != 0:
            status = 1
            with open(args.json, "a") as f:
                f.write(json.dumps({"shape": name, "impl": "process", "error": f"rc {rc}"}) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
