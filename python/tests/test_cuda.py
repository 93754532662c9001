# SPDX-License-Identifier: Apache-2.0
"""CUDA tensors through the CUDA plugin (a GPU host; scripts/device/py-cuda.sh runs this file there). Skipped
without torch, a CUDA device or a usable libmaxsim CUDA plugin; MAXSIM_PY_CUDA_REQUIRE=1 turns those skips into
failures (the device section sets it).

What is checked: CUDA tensors are read in place on the device (no host round trip: a CPU-only context refuses
them, the torch allocator sees only the outputs, an in-place write shows in the next call) and outputs come back
on the caller's device; float32 scores, argmaxes, pairs, candidates and top-k equal the CPU's bit for bit (the
plugin runs the CPU's FMA chain for f32, docs/cuda.md); 16-bit inputs are within the float32 bound of the
float64 reference (tensor cores: not the CPU's bits); autograd on CUDA matches the CPU backward (deterministic:
bit-identical across runs; atomic: within float32 rounding); NaN/Inf in a device tensor raises NonFiniteError;
PyLate's functions on CUDA tensors through maxsim.integrations.pylate."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import real_batch, reference_matrix, tolerance

torch = pytest.importorskip("torch", reason="torch is not installed")

import maxsim  # noqa: E402
import maxsim.torch as mt  # noqa: E402

REQUIRE = os.environ.get("MAXSIM_PY_CUDA_REQUIRE", "0") == "1"


def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    try:
        maxsim.context(backend="cuda")
    except maxsim.Error as e:
        return f"no usable libmaxsim CUDA plugin ({e}); build it (-DMAXSIM_CUDA=ON) and set MAXSIM_PLUGIN_PATH"
    return None


_REASON = _unavailable()
if _REASON is not None:
    if REQUIRE:
        raise RuntimeError(f"MAXSIM_PY_CUDA_REQUIRE=1 but {_REASON}")
    pytest.skip(_REASON, allow_module_level=True)

DEV = torch.device("cuda")


def _rand(*shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _same_bits(a, b, what=""):
    a, b = a.detach().cpu(), b.detach().cpu() if isinstance(b, torch.Tensor) else torch.as_tensor(b)
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} vs {b.dtype}"
    if a.dtype.is_floating_point:
        ai, bi = a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    else:
        ai, bi = a, b
    diff = (ai != bi).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} elements differ, first at {diff[0].tolist()}: " \
                              f"{a[tuple(diff[0])].item()!r} vs {b[tuple(diff[0])].item()!r}"


def test_the_cuda_backend_is_active():
    info = maxsim.info(backend="cuda")
    assert info["backend"] == "cuda", info["report"]
    assert any("cuda" in p for p in info["plugins"]), info["plugins"]


@pytest.mark.parametrize("metric", ["dot", "cosine"])
@pytest.mark.parametrize("shape", [(3, 32, 40, 180, 128), (2, 7, 9, 33, 72), (1, 40, 5, 1, 3), (4, 1, 6, 300, 100)])
def test_scores_and_argmax_equal_cpu_bits(metric, shape):
    nq, lq, nd, ld, d = shape
    Q, D = _rand(nq, lq, d, seed=1), _rand(nd, ld, d, seed=2)
    s, a = maxsim.scores(Q.to(DEV), D.to(DEV), metric=metric, return_argmax=True)
    # DEV is torch.device("cuda") (no index); results are on the current CUDA device, e.g. cuda:0
    assert s.is_cuda and a.is_cuda and s.device == Q.to(DEV).device
    s_cpu, a_cpu = maxsim.scores(Q, D, metric=metric, return_argmax=True)
    _same_bits(s, s_cpu, f"scores {shape} {metric}")
    _same_bits(a, a_cpu, f"argmax {shape} {metric}")
    ref = reference_matrix(list(Q.numpy()), list(D.numpy()), metric=metric)
    np.testing.assert_allclose(s.cpu().numpy(), ref, atol=tolerance(list(Q.numpy()), list(D.numpy())), rtol=0)


def test_masks_ragged_lists_and_sets_equal_cpu_bits():
    Q, D = _rand(3, 16, 64, seed=3), _rand(6, 50, 64, seed=4)
    q_mask = torch.ones(3, 16, dtype=torch.bool)
    q_mask[1, 9:] = False
    d_mask = torch.ones(6, 50, dtype=torch.long)
    d_mask[2, 20:] = 0
    d_mask[4, :] = 0  # an empty document
    D[2, 20:] = 7.0  # masked rows must never win
    got = maxsim.scores(Q.to(DEV), D.to(DEV), q_mask=q_mask.to(DEV), d_mask=d_mask.to(DEV))
    _same_bits(got, maxsim.scores(Q, D, q_mask=q_mask, d_mask=d_mask), "masked scores")
    lengths = [50, 1, 20, 0, 33, 7]
    docs = [D[i, :n] for i, n in enumerate(lengths)]
    got = maxsim.scores(Q.to(DEV), [x.to(DEV) for x in docs])
    _same_bits(got, maxsim.scores(Q, docs), "ragged list")
    flat = torch.cat(docs)
    got = maxsim.scores(maxsim.Sets(Q.to(DEV)), maxsim.Sets(flat.to(DEV), lengths=lengths))
    _same_bits(got, maxsim.scores(Q, maxsim.Sets(flat, lengths=lengths)), "Sets with lengths")
    # One [L, d] query: its axis is dropped, as on the CPU.
    one = maxsim.scores(Q[0].to(DEV), D.to(DEV))
    assert one.shape == (6,) and one.is_cuda
    _same_bits(one, maxsim.scores(Q[0], D), "single query")


def test_strided_rows_are_read_in_place():
    base = _rand(8, 40, 96, seed=5).to(DEV)
    D = base[:, ::2]  # every other token: row stride 2 * dim, not contiguous
    Q = _rand(2, 12, 96, seed=6).to(DEV)
    _same_bits(maxsim.scores(Q, D), maxsim.scores(Q.cpu(), D.cpu().contiguous()), "strided document rows")


def test_adversarial_values_equal_cpu_bits():
    g = torch.Generator().manual_seed(7)
    # Ties: integer-valued tokens and repeated documents (equal scores; argmax ties to the same token).
    Q = torch.randint(-2, 3, (3, 8, 24), generator=g).float()
    D = torch.randint(-2, 3, (10, 30, 24), generator=g).float()
    D[5] = D[2]
    s, a = maxsim.scores(Q.to(DEV), D.to(DEV), return_argmax=True)
    s_cpu, a_cpu = maxsim.scores(Q, D, return_argmax=True)
    _same_bits(s, s_cpu, "ties: scores")
    _same_bits(a, a_cpu, "ties: argmax")
    # All-negative similarities with padding: the masked token must not score 0.
    Q = torch.ones(1, 4, 16)
    D = -torch.rand(3, 12, 16, generator=g) - 0.5
    m = torch.ones(3, 12, dtype=torch.bool)
    m[:, 8:] = False
    D[:, 8:] = 0.0
    s = maxsim.scores(Q.to(DEV), D.to(DEV), d_mask=m.to(DEV))
    assert (s < 0).all()
    _same_bits(s, maxsim.scores(Q, D, d_mask=m), "all-negative with padding")
    # Huge and tiny norms (finite similarities), near-ties one ulp apart.
    for scale_q, scale_d in [(1e15, 1e3), (1e-12, 1e-6), (1.0, 1e-19)]:
        Q, D = _rand(2, 9, 40, seed=8, scale=scale_q), _rand(5, 21, 40, seed=9, scale=scale_d)
        D[3, 4] = torch.nextafter(D[3, 4], torch.full_like(D[3, 4], float("inf")))
        s, a = maxsim.scores(Q.to(DEV), D.to(DEV), return_argmax=True)
        s_cpu, a_cpu = maxsim.scores(Q, D, return_argmax=True)
        _same_bits(s, s_cpu, f"norms {scale_q:g} x {scale_d:g}: scores")
        _same_bits(a, a_cpu, f"norms {scale_q:g} x {scale_d:g}: argmax")


def test_pairs_and_candidates_equal_cpu_bits():
    Q, D = _rand(5, 20, 128, seed=10), _rand(5, 60, 128, seed=11)
    got, arg = maxsim.pairs(Q.to(DEV), D.to(DEV), return_argmax=True)
    assert got.is_cuda and arg.is_cuda
    s_cpu, a_cpu = maxsim.pairs(Q, D, return_argmax=True)
    _same_bits(got, s_cpu, "pairs")
    _same_bits(arg, a_cpu, "pairs argmax")
    # KD layout [Nq, K, Ld, d] with a mask.
    Dk = _rand(5, 4, 60, 128, seed=12)
    mk = torch.ones(5, 4, 60, dtype=torch.bool)
    mk[1, 2, 30:] = False
    got = maxsim.candidates(Q.to(DEV), Dk.to(DEV), d_mask=mk.to(DEV))
    assert got.shape == (5, 4) and got.is_cuda
    _same_bits(got, maxsim.candidates(Q, Dk, d_mask=mk), "KD candidates")
    # Candidate indices into a collection (repeats allowed) and ragged candidate lists.
    Dc = _rand(30, 45, 128, seed=13)
    idx = torch.tensor([[0, 5, 5, 29], [1, 2, 3, 4], [29, 28, 0, 0], [7, 7, 7, 7], [10, 20, 11, 21]])
    got = maxsim.candidates(Q.to(DEV), Dc.to(DEV), idx)
    _same_bits(got, maxsim.candidates(Q, Dc, idx), "candidate indices")
    lists = [[3], [], [0, 1, 2], [29], [5, 5]]
    got = maxsim.candidates(Q.to(DEV), Dc.to(DEV), lists)
    _same_bits(got, maxsim.candidates(Q, Dc, lists), "candidate lists")


def test_topk_equals_cpu():
    Q, D = _rand(4, 32, 128, seed=14), _rand(40, 80, 128, seed=15)
    D[17] = D[3]  # a tie: the lower index ranks first
    corpus = maxsim.pack(D, ids=np.arange(1000, 1040, dtype=np.uint64))
    for k in (1, 7, 45):
        cpu = maxsim.topk(Q, corpus, k)
        dense = maxsim.topk(Q.to(DEV), D.to(DEV), k)  # device tensors: scored and ranked on the device
        packed = maxsim.topk(Q.to(DEV), corpus, k)  # a packed (host) corpus: the library's top-k
        on_gpu = maxsim.topk(Q.to(DEV), corpus, k, backend="cuda")  # the plugin's top-k on the uploaded corpus
        for top, what in ((dense, "CUDA documents"), (packed, "packed corpus"), (on_gpu, "packed corpus, cuda")):
            assert top.scores.is_cuda and top.indices.is_cuda, what
            _same_bits(top.scores, cpu.scores, f"top-{k} scores, {what}")
            _same_bits(top.indices, cpu.indices, f"top-{k} indices, {what}")
        assert packed.ids.is_cuda
        _same_bits(packed.ids, cpu.ids, f"top-{k} ids")
        assert dense.ids is None
    one = maxsim.topk(Q[0].to(DEV), D.to(DEV), 5)
    assert one.scores.shape == (5,)
    _same_bits(one.indices, maxsim.topk(Q[0], corpus, 5).indices, "single query top-k")


def test_topk_in_blocks_on_the_device(monkeypatch):
    # CUDA documents: blocks of _TOPK_BLOCK_PAIRS (query, document) pairs merged into the running top-k. The same
    # bits for every block size as the library's top-k on the packed corpus, and the torch allocator's peak is
    # bounded by the block, not by the Nq x Nd matrix.
    from maxsim import _api

    Q = torch.randint(-2, 3, (6, 8, 64), generator=torch.Generator().manual_seed(33)).float()
    D = torch.randint(-2, 3, (3000, 12, 64), generator=torch.Generator().manual_seed(34)).float()
    D[1500], D[2999] = D[7], D[7]  # ties across blocks: the lower index first
    cpu = maxsim.topk(Q, maxsim.pack(D), 20)
    Qd, Dd = Q.to(DEV), D.to(DEV)
    for block in (1000, 4096, 1 << 24):
        monkeypatch.setattr(_api, "_TOPK_BLOCK_PAIRS", block)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        top = maxsim.topk(Qd, Dd, 20)
        torch.cuda.synchronize()
        _same_bits(top.scores, cpu.scores, f"blocks of {block} pairs: scores")
        _same_bits(top.indices, cpu.indices, f"blocks of {block} pairs: indices")
        if block < 6 * 3000:
            # A block's scores, their sort and the running top-k: ~24 bytes a pair (+ allocator rounding), far
            # below the 6 x 3000 matrix sorted at once (~430 KB).
            peak = torch.cuda.max_memory_allocated() - base
            assert peak <= 32 * (block + 6 * 20) + 64 * 1024, f"blocks of {block} pairs: peak {peak} bytes"


def test_tensors_run_on_the_gpu_they_live_on():
    # Dense device tensors run on their own GPU: an explicit devices= naming another is refused before any call.
    Q, D = _rand(2, 8, 64, seed=35).to(DEV), _rand(5, 20, 64, seed=36).to(DEV)
    here = Q.device.index
    other = str(here + 1)
    with pytest.raises(maxsim.InvalidArgumentError, match=f"devices='{other}'"):
        maxsim.scores(Q, D, devices=other)
    with pytest.raises(maxsim.InvalidArgumentError, match=f"devices='{other},{here}'"):
        maxsim.pairs(Q, D[:2], devices=f"{other},{here}")  # dense tensors run on the list's first device
    _same_bits(maxsim.scores(Q, D, devices=str(here)), maxsim.scores(Q.cpu(), D.cpu()), "devices= its own GPU")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (tensors on cuda:1, torch's current device 0)")
def test_tensors_on_a_second_gpu(monkeypatch):
    # Tensors on cuda:1 while torch's current device is cuda:0: every call runs on cuda:1 (its stream, its
    # memory), outputs stay there, the caller's current device is unchanged, and MAXSIM_CUDA_DEVICE (which picks
    # the device for packed corpora) does not send them elsewhere. Mixing GPUs in one call is refused.
    monkeypatch.setenv("MAXSIM_CUDA_DEVICE", "0")
    monkeypatch.setenv("MAXSIM_CUDA_DEVICES", "0")
    one = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    Q0, D0 = _rand(3, 16, 96, seed=37), _rand(7, 40, 96, seed=38)
    mask = torch.ones(7, 40, dtype=torch.bool)
    mask[2, 10:] = False
    Q, D, m = Q0.to(one), D0.to(one), mask.to(one)
    s, a = maxsim.scores(Q, D, d_mask=m, return_argmax=True)
    assert s.device == one and a.device == one and torch.cuda.current_device() == 0
    s_cpu, a_cpu = maxsim.scores(Q0, D0, d_mask=mask, return_argmax=True)
    _same_bits(s, s_cpu, "scores on cuda:1")
    _same_bits(a, a_cpu, "argmax on cuda:1")
    _same_bits(maxsim.pairs(Q, D[:3]), maxsim.pairs(Q0, D0[:3]), "pairs on cuda:1")
    _same_bits(maxsim.candidates(Q, D, torch.tensor([[0, 6], [2, 2], [5, 1]])),
               maxsim.candidates(Q0, D0, torch.tensor([[0, 6], [2, 2], [5, 1]])), "candidates on cuda:1")
    top = maxsim.topk(Q, D, 4)
    assert top.scores.device == one
    _same_bits(top.indices, maxsim.topk(Q0, maxsim.pack(D0), 4).indices, "top-k on cuda:1")
    _, gq, gd = _autograd(Q0, D0, mask, _rand(3, 7, seed=39), one, True)
    _, gq_cpu, gd_cpu = _autograd(Q0, D0, mask, _rand(3, 7, seed=39), "cpu", True)
    assert gq.device == one and torch.cuda.current_device() == 0
    torch.testing.assert_close(gq.cpu(), gq_cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gd.cpu(), gd_cpu, atol=1e-5, rtol=1e-5)
    with pytest.raises(maxsim.InvalidArgumentError, match="cuda:0 and on cuda:1"):
        maxsim.scores(Q0.to(DEV), D)
    with pytest.raises(maxsim.InvalidArgumentError, match="mask lives on CUDA device 0 but the tokens on device 1"):
        maxsim.scores(Q, D, d_mask=mask.to(DEV))
    with pytest.raises(maxsim.InvalidArgumentError, match=r"documents\[1\] lives on cuda:0"):
        maxsim.scores(Q, [D[0], D0[1].to(DEV)])
    with pytest.raises(maxsim.InvalidArgumentError, match="devices='0'"):
        maxsim.scores(Q, D, devices="0")


def test_cuda_queries_against_a_packed_corpus():
    # A packed corpus is host memory: CUDA queries are scored as host copies (every mode), outputs on their device.
    Q, D = _rand(3, 32, 128, seed=31), _rand(25, 60, 128, seed=32)
    corpus = maxsim.pack(D)
    for mode in ("exact", "certified"):
        for backend in (None, "cuda"):
            s, a = maxsim.scores(Q.to(DEV), corpus, mode=mode, return_argmax=True, backend=backend)
            assert s.is_cuda and a.is_cuda
            s_cpu, a_cpu = maxsim.scores(Q, corpus, mode=mode, return_argmax=True)
            _same_bits(s, s_cpu, f"scores vs packed, {mode}, backend {backend}")
            _same_bits(a, a_cpu, f"argmax vs packed, {mode}, backend {backend}")
    _same_bits(maxsim.scores(Q.to(DEV), corpus, mode="certified"), maxsim.scores(Q, D), "certified == exact")
    idx = torch.tensor([[0, 24, 3], [5, 5, 6], [1, 2, 3]])
    got = maxsim.candidates(Q.to(DEV), corpus, idx)
    assert got.is_cuda
    _same_bits(got, maxsim.candidates(Q, corpus, idx), "candidates vs packed")
    got = maxsim.pairs(Q.to(DEV), maxsim.pack(D[:3]))
    assert got.is_cuda
    _same_bits(got, maxsim.pairs(Q, D[:3]), "pairs vs packed")


def test_half_precision_within_the_f32_bound():
    # Tensor cores: 16-bit inputs are not the CPU's bits; every score is within the f32 bound of float64.
    for dt in (torch.bfloat16, torch.float16):
        Q, D = _rand(3, 32, 128, seed=16, dtype=dt), _rand(20, 100, 128, seed=17, dtype=dt)
        s = maxsim.scores(Q.to(DEV), D.to(DEV))
        assert s.dtype == torch.float32 and s.is_cuda
        q64, d64 = list(Q.double().numpy()), list(D.double().numpy())
        np.testing.assert_allclose(s.cpu().numpy(), reference_matrix(q64, d64), atol=tolerance(q64, d64), rtol=0)


def test_real_colbert_embeddings_equal_cpu_bits(real_data):
    Q = [torch.from_numpy(q) for q in real_data["queries"]]
    D = [torch.from_numpy(d) for d in real_data["docs"]]
    got, arg = maxsim.scores([q.to(DEV) for q in Q], [d.to(DEV) for d in D], return_argmax=True)
    s_cpu, a_cpu = maxsim.scores(Q, D, return_argmax=True)
    _same_bits(got, s_cpu, "real data scores")
    _same_bits(arg, a_cpu, "real data argmax")
    top = maxsim.topk(torch.stack(Q).to(DEV), maxsim.pack(D), 10)
    cpu = maxsim.topk(torch.stack(Q), maxsim.pack(D), 10)
    _same_bits(top.scores, cpu.scores, "real data top-10")
    _same_bits(top.indices, cpu.indices, "real data top-10 indices")


def test_no_host_round_trip():
    Q, D = _rand(2, 32, 128, seed=18).to(DEV), _rand(64, 128, 128, seed=19).to(DEV)
    # The CPU backend cannot read device memory, and the binding never copies it to the host: refused.
    with pytest.raises(maxsim.BackendUnavailableError):
        maxsim.scores(Q, D, backend="cpu")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    s, a = maxsim.scores(Q, D, return_argmax=True)
    torch.cuda.synchronize()
    # The torch allocator sees the outputs only (it rounds blocks up to 512 bytes): no device copy of the inputs.
    rounded = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in (s, a))
    assert torch.cuda.memory_allocated() - before <= rounded
    # The library reads the caller's device memory: an in-place change shows in the next call.
    D[5].zero_()
    after = maxsim.scores(Q, D)
    assert (after[:, 5] == 0).all() and (s[:, 5] != 0).all()
    keep = [j for j in range(64) if j != 5]
    _same_bits(after[:, keep], s[:, keep], "unchanged documents")


def test_tensors_from_the_expandable_segments_allocator():
    """The plugin checks that a device tensor ends inside its CUDA allocation (caller_memory.cc). PyTorch's
    expandable segments map memory in chunks into one reserved address range; a corpus spanning several chunks
    must still be accepted and score as on the CPU. The allocator setting only takes effect before CUDA starts,
    so this runs in a fresh interpreter."""
    import subprocess
    import sys

    script = """
import torch, maxsim
def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)
keep = [torch.empty(3 << 20, dtype=torch.uint8, device="cuda") for _ in range(5)]  # chunks in use before D's
Q, D = rand(2, 32, 128, seed=22), rand(600, 300, 128, seed=23)  # D: 92 MB of float32
Dd = D.to("cuda")
segments = torch.cuda.memory_snapshot()
expandable = any(s.get("is_expandable", False) for s in segments)
got = maxsim.scores(Q.to("cuda"), Dd).cpu()
want = maxsim.scores(Q, D)
same = torch.equal(got.view(torch.int32), want.view(torch.int32))
print("expandable" if expandable else "not-expandable", "same" if same else "differ")
"""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"the scoring call failed under expandable segments:\n{r.stderr[-2000:]}"
    words = r.stdout.split()
    assert words[-1] == "same", f"scores differ from the CPU's under expandable segments: {r.stdout}"
    if words[-2] != "expandable":
        pytest.skip("this torch did not report expandable segments (memory_snapshot has no is_expandable)")


def test_non_default_stream():
    Q, D = _rand(3, 16, 64, seed=20), _rand(12, 40, 64, seed=21)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        Qd, Dd = Q.to(DEV, non_blocking=False), D.to(DEV)
        s = maxsim.scores(Qd, Dd)
    stream.synchronize()
    _same_bits(s, maxsim.scores(Q, D), "scores on a side stream")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_device_input_raises(value):
    Q, D = _rand(2, 8, 64, seed=22).to(DEV), _rand(6, 30, 64, seed=23).to(DEV)
    D[4, 17, 5] = value
    with pytest.raises(maxsim.NonFiniteError):
        maxsim.scores(Q, D)
    Q2 = Q.clone()
    Q2[1, 3, 0] = value
    with pytest.raises(maxsim.NonFiniteError):
        maxsim.pairs(Q2, D[:2])
    # The context still works afterwards.
    D[4, 17, 5] = 0.0
    _same_bits(maxsim.scores(Q, D), maxsim.scores(Q.cpu(), D.cpu()), "after an error")


def test_stream_ordered_calls_give_the_synchronous_bits():
    # stream_ordered=True returns without waiting for the GPU; maxsim.synchronize() waits and raises nothing here.
    Q, D = _rand(5, 16, 128, seed=40).to(DEV), _rand(9, 70, 128, seed=41).to(DEV)
    mask = torch.ones(9, 70, dtype=torch.bool, device=DEV)
    mask[2, 30:] = False
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        s, a = maxsim.scores(Q, D, d_mask=mask, return_argmax=True, stream_ordered=True)
        p = maxsim.pairs(Q, D[:5], stream_ordered=True)
        c = maxsim.candidates(Q, D, torch.tensor([[0, 3], [8, 8], [1, 2], [4, 0], [7, 6]]), stream_ordered=True)
    maxsim.synchronize()
    s_sync, a_sync = maxsim.scores(Q, D, d_mask=mask, return_argmax=True)
    _same_bits(s, s_sync, "stream-ordered scores")
    _same_bits(a, a_sync, "stream-ordered argmax")
    _same_bits(p, maxsim.pairs(Q, D[:5]), "stream-ordered pairs")
    _same_bits(c, maxsim.candidates(Q, D, torch.tensor([[0, 3], [8, 8], [1, 2], [4, 0], [7, 6]])), "candidates")


def test_stream_ordered_failure_is_raised_by_synchronize():
    Q, D = _rand(2, 8, 64, seed=42).to(DEV), _rand(6, 30, 64, seed=43).to(DEV)
    D[4, 17, 5] = float("nan")
    with pytest.raises(maxsim.NonFiniteError) as sync_error:
        maxsim.scores(Q, D)
    s = maxsim.scores(Q, D, stream_ordered=True)  # no exception: the check runs on the GPU
    with pytest.raises(maxsim.NonFiniteError) as deferred:
        maxsim.synchronize()
    assert "maxsim_score_matrix (stream-ordered): " in str(deferred.value), str(deferred.value)
    assert str(sync_error.value).split("backend cuda: ")[-1] in str(deferred.value)
    assert torch.isnan(s).all()
    maxsim.synchronize()  # reported once
    D[4, 17, 5] = 0.0
    _same_bits(maxsim.scores(Q, D), maxsim.scores(Q.cpu(), D.cpu()), "after a deferred error")
    with pytest.raises(maxsim.InvalidArgumentError, match="MAXSIM_CALL_STREAM_ORDERED"):
        maxsim.scores(Q.cpu(), D.cpu(), stream_ordered=True)


@pytest.mark.parametrize("deterministic", [True, False])
def test_stream_ordered_autograd_step(deterministic):
    Q0, D0 = _rand(6, 32, 128, seed=44), _rand(10, 90, 128, seed=45)
    w = _rand(6, 10, seed=46).to(DEV)
    grads = []
    for ordered in (False, True):
        Q = Q0.to(DEV).clone().requires_grad_()
        D = D0.to(DEV).clone().requires_grad_()
        s = mt.maxsim(Q, D, deterministic=deterministic, stream_ordered=ordered)
        (s * w).sum().backward()
        maxsim.synchronize()
        grads.append((s.detach(), Q.grad, D.grad))
    _same_bits(grads[1][0], grads[0][0], "stream-ordered forward")
    _same_bits(grads[1][1], grads[0][1], "stream-ordered grad_Q")
    if deterministic:
        _same_bits(grads[1][2], grads[0][2], "stream-ordered grad_D")
    else:
        torch.testing.assert_close(grads[1][2], grads[0][2], atol=1e-5, rtol=1e-5)
    # A non-finite score gradient: NaN gradients, the error from synchronize.
    Q = Q0.to(DEV).clone().requires_grad_()
    D = D0.to(DEV).clone().requires_grad_()
    s = mt.maxsim(Q, D, deterministic=deterministic, stream_ordered=True)
    bad = w.clone()
    bad[1, 2] = float("inf")
    (s * bad).sum().backward()
    with pytest.raises(maxsim.NonFiniteError, match="maxsim_backward \\(stream-ordered\\)"):
        maxsim.synchronize()
    assert torch.isnan(Q.grad).all() and torch.isnan(D.grad).all()


def _autograd(Q0, D0, mask, w, device, deterministic):
    Q = Q0.to(device).clone().requires_grad_()
    D = D0.to(device).clone().requires_grad_()
    m = None if mask is None else mask.to(device)
    s = mt.maxsim(Q, D, d_mask=m, deterministic=deterministic)
    (s * w.to(device)).sum().backward()
    return s, Q.grad, D.grad


@pytest.mark.parametrize("deterministic", [True, False])
def test_autograd_matches_cpu_backward(deterministic):
    Q0, D0 = _rand(6, 32, 128, seed=24), _rand(10, 90, 128, seed=25)
    mask = torch.ones(10, 90, dtype=torch.bool)
    mask[3, 40:] = False
    w = _rand(6, 10, seed=26)
    s_cpu, gq_cpu, gd_cpu = _autograd(Q0, D0, mask, w, "cpu", True)
    s, gq, gd = _autograd(Q0, D0, mask, w, DEV, deterministic)
    assert gq.is_cuda and gd.is_cuda
    _same_bits(s, s_cpu, "forward")
    # float32 sums in another order: within rounding of the CPU's (values here are O(1)-O(10)).
    torch.testing.assert_close(gq.cpu(), gq_cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gd.cpu(), gd_cpu, atol=1e-5, rtol=1e-5)
    assert torch.all(gd[3, 40:] == 0)
    if deterministic:
        _, gq2, gd2 = _autograd(Q0, D0, mask, w, DEV, True)
        _same_bits(gq2, gq, "deterministic grad_Q, second run")
        _same_bits(gd2, gd, "deterministic grad_D, second run")


def test_autograd_pairs_on_real_shapes(real_data):
    Q0, D0, mask = real_batch(real_data)
    w = _rand(Q0.shape[0], D0.shape[0], seed=27)
    s_cpu, gq_cpu, gd_cpu = _autograd(Q0, D0, mask, w, "cpu", True)
    s, gq, gd = _autograd(Q0, D0, mask, w, DEV, True)
    _same_bits(s, s_cpu, "real forward")
    torch.testing.assert_close(gq.cpu(), gq_cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gd.cpu(), gd_cpu, atol=1e-5, rtol=1e-5)
    Qp, Dp = Q0.clone().to(DEV).requires_grad_(), D0[:Q0.shape[0]].clone().to(DEV).requires_grad_()
    mt.maxsim_pairs(Qp, Dp, d_mask=mask[:Q0.shape[0]].to(DEV)).sum().backward()
    Qc, Dc = Q0.clone().requires_grad_(), D0[:Q0.shape[0]].clone().requires_grad_()
    mt.maxsim_pairs(Qc, Dc, d_mask=mask[:Q0.shape[0]]).sum().backward()
    torch.testing.assert_close(Qp.grad.cpu(), Qc.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(Dp.grad.cpu(), Dc.grad, atol=1e-5, rtol=1e-5)


def test_pylate_on_cuda_tensors(monkeypatch):
    try:
        import pylate.rank  # noqa: F401 - enable() patches its rerank
        import pylate.scores
    except ImportError as e:
        pytest.skip(f"PyLate's scoring and ranking modules do not import here ({e}); its CUDA path is not checked")

    import maxsim.integrations.pylate as mp

    monkeypatch.delenv("MAXSIM_PYLATE", raising=False)
    monkeypatch.delenv("PYLATE_SCORES_BACKEND", raising=False)
    assert mp.enable()
    try:
        Q, D = _rand(4, 32, 128, seed=28).to(DEV), _rand(9, 70, 128, seed=29).to(DEV)
        mask = torch.ones(9, 70, device=DEV)
        mask[2, 50:] = 0
        ours = pylate.scores.colbert_scores(Q, D, documents_mask=mask)
        assert ours.is_cuda
        _same_bits(ours, maxsim.scores(Q.cpu(), D.cpu(), d_mask=mask.cpu()), "PyLate colbert_scores on CUDA")
        theirs = pylate.scores.colbert.colbert_scores.__maxsim_original__(Q, D, documents_mask=mask, backend="torch")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
        Dk = D[:8].reshape(4, 2, 70, 128)
        kd = pylate.scores.colbert_kd_scores(Q, Dk)
        assert kd.is_cuda
        _same_bits(kd, maxsim.candidates(Q.cpu(), Dk.cpu()), "PyLate colbert_kd_scores on CUDA")
        Qg, Dg = Q.clone().requires_grad_(), D.clone().requires_grad_()
        pylate.scores.colbert_scores(Qg, Dg, documents_mask=mask).sum().backward()
        assert Qg.grad.is_cuda and Dg.grad.is_cuda
    finally:
        mp.disable()


def test_colpali_on_cuda_tensors(monkeypatch):
    pytest.importorskip("colpali_engine.utils.processing_utils",
                        reason="colpali-engine is not installed (its CUDA path is not checked)")
    import colpali_engine.utils.maxsim as cmaxsim
    from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor as Base

    import maxsim.integrations.colpali as mc

    monkeypatch.delenv("MAXSIM_COLPALI", raising=False)
    monkeypatch.delenv("COLPALI_SCORES_BACKEND", raising=False)
    assert mc.enable()
    try:
        qs = [_rand(n, 128, seed=30 + n).to(DEV) for n in (20, 31, 7)]
        ps = [_rand(n, 128, seed=40 + n).to(DEV) for n in (700, 1030, 512, 64)]  # ColPali page-sized passages
        ours = Base.score_multi_vector(qs, ps)
        assert ours.device.type == "cpu" and ours.dtype == torch.float32  # colpali-engine's contract
        _same_bits(ours, maxsim.scores([q.cpu() for q in qs], [p.cpu() for p in ps]), "score_multi_vector on CUDA")
        theirs = Base.score_multi_vector.__maxsim_original__(qs, ps, device=DEV)
        torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-5)
        Q = torch.nn.utils.rnn.pad_sequence(qs, batch_first=True)
        D = torch.nn.utils.rnn.pad_sequence(ps, batch_first=True)
        s = cmaxsim.maxsim_inbatch(Q, D)
        assert s.is_cuda
        _same_bits(s, maxsim.scores(Q.cpu(), D.cpu()), "maxsim_inbatch on CUDA")
        Qg = Q.clone().requires_grad_()
        cmaxsim.maxsim_inbatch(Qg, D).sum().backward()
        assert Qg.grad.is_cuda
    finally:
        mc.disable()
