# SPDX-License-Identifier: Apache-2.0
"""numpy API: parity with a float64 reference (random, adversarial, real), certified == exact bit for bit, the
same bits as the C API called directly, zero copy, packing round trips, and top-k / pairs / candidates."""

from __future__ import annotations

import ctypes
import pathlib
import sys

import numpy as np
import pytest

import maxsim
from conftest import reference_matrix, tolerance


def ragged(rng, n, lo, hi, d, scale=1.0):
    return [(rng.standard_normal((int(rng.integers(lo, hi + 1)), d)) * scale).astype(np.float32) for _ in range(n)]


def test_version_and_info():
    assert maxsim.__version__.count(".") == 2
    info = maxsim.info()
    assert info["version"] == maxsim.__version__
    names = [k["name"] for k in info["kernels"]]
    assert info["kernel"] in names and "scalar" in names
    assert info["threads"] >= 1 and info["backend"] in ("cpu", "cuda")
    assert "Selected kernel" in info["report"]


def test_a_stub_torch_module_does_not_break_numpy_calls(rng, monkeypatch):
    # maxsim recognises torch tensors through the imported torch module; a module without Tensor (a stub, or torch
    # part-way through its import) must leave numpy calls alone.
    import types

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    Q, D = rng.standard_normal((1, 2, 8), dtype=np.float32), rng.standard_normal((3, 2, 8), dtype=np.float32)
    S = maxsim.scores(Q, D)
    assert isinstance(S, np.ndarray) and S.shape == (1, 3)


@pytest.mark.parametrize("metric", ["dot", "cosine"])
@pytest.mark.parametrize("d", [1, 7, 64, 128, 131])
def test_random_uniform_matches_float64(rng, metric, d):
    Q = rng.standard_normal((4, 9, d)).astype(np.float32)
    D = rng.standard_normal((6, 13, d)).astype(np.float32)
    S = maxsim.scores(Q, D, metric=metric)
    ref = reference_matrix(list(Q), list(D), metric=metric)
    assert S.shape == (4, 6) and S.dtype == np.float32
    np.testing.assert_allclose(S, ref, rtol=0, atol=tolerance(list(Q), list(D)))


def test_ragged_lists_sets_and_masks_agree(rng):
    d = 32
    Q = ragged(rng, 3, 1, 12, d)
    D = ragged(rng, 7, 1, 40, d)
    ref = reference_matrix(Q, D)
    S_list = maxsim.scores(Q, D)
    np.testing.assert_allclose(S_list, ref, atol=tolerance(Q, D), rtol=0)
    # The same documents as [n, L, d] + mask, as Sets(tokens, lengths=...), and as a packed corpus: same bits.
    L = max(len(x) for x in D)
    padded = np.zeros((len(D), L, d), np.float32)
    mask = np.zeros((len(D), L), bool)
    for i, x in enumerate(D):
        padded[i, :len(x)] = x
        mask[i, :len(x)] = True
    padded[~mask] = 1e3  # masked rows must be excluded, never read as values
    S_mask = maxsim.scores(Q, padded, d_mask=mask)
    S_sets = maxsim.scores(Q, maxsim.Sets(np.concatenate(D), lengths=[len(x) for x in D]))
    S_packed = maxsim.scores(Q, maxsim.pack(D))
    for other in (S_mask, S_sets, S_packed):
        assert np.array_equal(other, S_list)


def test_adversarial_values(rng):
    d = 16
    # Ties (duplicate document tokens), all-negative similarities with padding (a padded 0 must never win),
    # huge and tiny norms, an empty document, a single-token query.
    base = rng.standard_normal((5, d)).astype(np.float32)
    D = [np.concatenate([base, base]), -np.abs(rng.standard_normal((3, d))).astype(np.float32),
         (rng.standard_normal((4, d)) * 1e15).astype(np.float32), (rng.standard_normal((4, d)) * 1e-20).astype(np.float32),
         np.zeros((0, d), np.float32)]
    Q = [np.abs(rng.standard_normal((6, d))).astype(np.float32), base[:1].copy()]
    S, A = maxsim.scores(Q, D, return_argmax=True)
    ref = reference_matrix(Q, D)
    assert S[0, 4] == -np.inf and S[1, 4] == -np.inf
    assert np.all(S[0, 1] < 0)  # all-negative: the true max, not a padded 0
    finite = np.isfinite(ref)
    np.testing.assert_allclose(S[finite], ref[finite], rtol=1e-5, atol=1e-30)
    # Ties go to the lowest document-token index: query token base[0] against [base, base] picks token 0.
    lq = [len(q) for q in Q]
    a1 = A[len(D) * lq[0]:].reshape(len(D), lq[1])  # query 1's block (ragged queries: flat C layout)
    assert a1[0, 0] == 0
    assert np.all(a1[4] == -1)


def test_empty_query_scores_zero(rng):
    D = [rng.standard_normal((3, 8)).astype(np.float32)]
    S = maxsim.scores([np.zeros((0, 8), np.float32)], D)
    assert S.shape == (1, 1) and S[0, 0] == 0.0


def test_real_data_parity_and_certified_bits(real_data):
    Q, D = real_data["queries"], real_data["docs"]
    ref = reference_matrix(Q, D)
    corpus = maxsim.pack(D)
    exact = maxsim.scores(Q, corpus)
    np.testing.assert_allclose(exact, ref, rtol=0, atol=tolerance(Q, D))
    cert, stats = maxsim.scores(Q, corpus, mode="certified", return_stats=True)
    assert np.array_equal(cert.view(np.uint32), exact.view(np.uint32))
    assert stats["pairs"] == len(Q) * len(D) and stats["refined"] > 0
    approx = maxsim.scores(Q, corpus, mode="approximate")
    np.testing.assert_allclose(approx, exact, rtol=1e-2)
    # Exact bits on every kernel this machine runs and on 1 and 2 threads.
    for k in maxsim.info()["kernels"]:
        if k["status"] in ("selected", "available"):
            for t in (1, 2):
                for mode in ("exact", "certified"):
                    got = maxsim.scores(Q, corpus, mode=mode, isa=k["name"], threads=t)
                    assert np.array_equal(got, exact), (k["name"], t, mode)


def test_topk_matches_matrix_and_ids(real_data):
    Q, D = real_data["queries"], real_data["docs"]
    ids = np.arange(len(D), dtype=np.uint64) * 7 + 3
    corpus = maxsim.pack(D, ids=ids)
    S = maxsim.scores(Q, corpus)
    for mode in ("exact", "certified"):
        top = maxsim.topk(Q, corpus, 10, mode=mode)
        order = np.lexsort((np.broadcast_to(np.arange(len(D)), S.shape), -S), axis=1)[:, :10]
        assert np.array_equal(top.indices, order)
        assert np.array_equal(top.scores, np.take_along_axis(S, order, axis=1))
        assert np.array_equal(top.ids, ids[order])
    big = maxsim.topk(Q[0], corpus, len(D) + 3)  # 2-D query: no query axis; tail past the corpus end
    assert big.scores.shape == (len(D) + 3,)
    assert np.all(big.indices[-3:] == -1) and np.all(np.isneginf(big.scores[-3:]))


def test_topk_numpy_fast_path_equals_general_path(rng):
    # numpy queries against a packed corpus take a one-step C++ path (maxsim._core.topk_numpy); maxsim.Sets
    # queries take the general one: the same results, shapes and dtypes, and the same errors.
    D = [rng.standard_normal((int(n), 24)).astype(np.float32) for n in rng.integers(0, 30, size=40)]
    Q = rng.standard_normal((3, 7, 24)).astype(np.float32)
    for ids in (None, np.arange(40, dtype=np.uint64) * 11 + 5):
        corpus = maxsim.pack(D, ids=ids)
        for q in (Q, Q[1]):
            for k in (1, 10, 45):
                for mode in ("exact", "certified"):
                    fast = maxsim.topk(q, corpus, k, mode=mode, metric="cosine")
                    general = maxsim.topk(maxsim.Sets(q), corpus, k, mode=mode, metric="cosine")
                    if q.ndim == 2:  # maxsim.Sets keeps the query axis
                        general = maxsim.TopK(*(None if a is None else a[0] for a in general))
                    for a, b in zip(fast, general):
                        if b is None:
                            assert a is None
                        else:
                            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
                    assert fast.indices.dtype == np.int64 and fast.scores.dtype == np.float32
                    assert (fast.ids is None) == (ids is None)
    corpus = maxsim.pack(D)
    bad = Q.copy()
    bad[0, 3, 2] = np.nan
    for call, exc in ((lambda: maxsim.topk(Q, corpus, -1), maxsim.InvalidArgumentError),
                      (lambda: maxsim.topk(Q, corpus, 0), maxsim.InvalidArgumentError),
                      (lambda: maxsim.topk(Q.astype(np.float64), corpus, 3), maxsim.InvalidArgumentError),
                      (lambda: maxsim.topk(Q[:, :, :20], corpus, 3), maxsim.InvalidArgumentError),
                      (lambda: maxsim.topk(np.ones((2, 3, 25), np.float32), corpus, 3), maxsim.DimMismatchError),
                      (lambda: maxsim.topk(bad, corpus, 3), maxsim.NonFiniteError),
                      (lambda: maxsim.topk(Q, corpus, 3, mode="fast"), maxsim.InvalidArgumentError),
                      (lambda: maxsim.topk(Q, corpus, 3, devices="0;1"), maxsim.InvalidArgumentError)):
        with pytest.raises(exc):
            call()
    corpus.close()
    with pytest.raises(maxsim.InvalidArgumentError, match="closed"):
        maxsim.topk(Q, corpus, 3)


def test_list_of_documents_read_in_place_equals_concatenation(rng):
    # A list of per-document arrays (PyLate's documents_embeddings) is read in place, one pointer per document
    # (maxsim_dense_sets.set_data): the same bits as the concatenated call in every operation, mode, metric and
    # dtype, with empty documents and a common row stride wider than dim; a list that needs a copy (mixed dtypes,
    # unlike row strides, a misaligned array) is concatenated, with the same bits again.
    d = 40
    docs = [rng.standard_normal((int(n), d)).astype(np.float32) for n in rng.integers(0, 200, size=300)]
    docs[8] = np.zeros((0, d), np.float32)
    Q = rng.standard_normal((3, 9, d)).astype(np.float32)
    lengths = [len(x) for x in docs]
    for dtype in (np.float32, np.float16):
        typed = [x.astype(dtype) for x in docs]
        whole = maxsim.Sets(np.concatenate(typed), lengths=lengths)
        for metric in ("dot", "cosine"):
            for mode in ("exact", "certified", "approximate"):
                got = maxsim.scores(Q.astype(dtype), typed, metric=metric, mode=mode)
                want = maxsim.scores(Q.astype(dtype), whole, metric=metric, mode=mode)
                assert got.shape == (3, 300) and np.array_equal(got, want), (dtype, metric, mode)
    whole = maxsim.Sets(np.concatenate(docs), lengths=lengths)
    S, A = maxsim.scores(Q, docs, return_argmax=True)
    S2, A2 = maxsim.scores(Q, whole, return_argmax=True)
    assert np.array_equal(S, S2) and np.array_equal(A, A2)
    top, top2 = maxsim.topk(Q, docs, 7, mode="certified"), maxsim.topk(Q, whole, 7, mode="certified")
    assert np.array_equal(top.scores, top2.scores) and np.array_equal(top.indices, top2.indices)
    assert np.array_equal(maxsim.pairs(list(Q), docs[:3]), maxsim.pairs(Q, maxsim.Sets(np.concatenate(docs[:3]), lengths=lengths[:3])))
    cand = [[5, 0, 299], [], [8, 8]]
    assert np.array_equal(maxsim.candidates(Q, docs, cand), maxsim.candidates(Q, whole, cand))
    # Queries as a list too; the packed corpus of a list holds the same bytes as that of the concatenation.
    assert np.array_equal(maxsim.scores(list(Q), docs), S)
    assert np.array_equal(maxsim.pack(docs).buffer(), maxsim.pack(np.concatenate(docs), lengths=lengths).buffer())
    # Slices of one array with a wider row stride (every other row): a common stride, read in place.
    wide = rng.standard_normal((2 * 500, d)).astype(np.float32)[::2]
    sliced = [wide[a:a + 50] for a in range(0, 500, 50)]
    assert np.array_equal(maxsim.scores(Q, sliced), maxsim.scores(Q, maxsim.Sets(np.ascontiguousarray(wide), lengths=[50] * 10)))
    # Lists that need a copy: concatenated, the same bits.
    strided = list(docs)
    strided[7] = rng.standard_normal((50, d)).astype(np.float32)[::2]
    mixed = docs[:5] + [docs[5].astype(np.float16)]
    raw = np.zeros(4 * d * 3 + 2, np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, count=3 * d, offset=2).reshape(3, d)
    assert misaligned.ctypes.data % 4 != 0
    for needs_copy in (strided, mixed, docs[:4] + [misaligned]):
        want = maxsim.scores(Q, maxsim.Sets(np.concatenate(needs_copy).astype(np.float32), lengths=[len(x) for x in needs_copy]))
        assert np.array_equal(maxsim.scores(Q, needs_copy), want)


def test_list_of_documents_is_not_copied(rng):
    """Zero copy, proven by memory accounting: scoring (and packing) a 128 MiB list of documents raises the
    process's peak resident memory (VmHWM, reset first through /proc/self/clear_refs) by far less than the list,
    and allocates next to nothing through Python (tracemalloc); a write to one document's array is seen by the
    next call."""
    import tracemalloc

    docs = [np.full((256, 128), 0.01 * (1 + i % 7), np.float32) for i in range(1024)]  # 128 MiB
    q = rng.standard_normal((32, 128)).astype(np.float32)

    def peak_rise(call) -> int:
        def status(key):
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = status("VmRSS:")
        call()
        return status("VmHWM:") - before

    S = maxsim.scores(q, docs, threads=1)
    rise = peak_rise(lambda: maxsim.scores(q, docs, threads=1))
    assert rise < 16 << 20, f"scoring a 128 MiB list raised peak memory by {rise} bytes"
    tracemalloc.start()
    maxsim.scores(q, docs, threads=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 256 << 10, f"scoring a 128 MiB list allocated {peak} bytes through Python"
    concatenated = peak_rise(lambda: maxsim.scores(q, maxsim.Sets(np.concatenate(docs), lengths=[256] * 1024), threads=1))
    assert concatenated > 100 << 20, f"the check cannot see a copy: concatenating raised peak memory by {concatenated}"
    # Packing reads the list in place too: the rise is the packed corpus (originals + codes), not a second copy.
    corpus_rise = peak_rise(lambda: maxsim.pack(docs, threads=1))
    assert corpus_rise < (128 + 40) << 20, corpus_rise
    docs[5][0] = 0.5  # document 5's first row
    S2 = maxsim.scores(q, docs, threads=1)
    assert S2[5] != S[5] and np.array_equal(np.delete(S2, 5), np.delete(S, 5))


def test_bad_lists_of_documents_are_refused(rng):
    d = 16
    Q = rng.standard_normal((2, 5, d)).astype(np.float32)
    docs = [rng.standard_normal((n, d)).astype(np.float32) for n in (3, 0, 4, 6)]
    with pytest.raises(maxsim.DimMismatchError, match=r"documents\[2\] has dim 17 but documents\[0\] has dim 16"):
        maxsim.scores(Q, docs[:2] + [np.ones((4, d + 1), np.float32)])
    with pytest.raises(maxsim.DimMismatchError):
        maxsim.scores(Q, [np.ones((3, d + 1), np.float32)])
    bad = [x.copy() for x in docs]
    bad[2][3, 5] = np.nan
    bad[3][0, 0] = np.inf
    for mode in ("exact", "certified"):
        with pytest.raises(maxsim.NonFiniteError, match="set 2 token 3"):
            maxsim.scores(Q, bad, mode=mode)
    with pytest.raises(maxsim.NonFiniteError, match="set 2 token 3"):
        maxsim.pack(bad)
    with pytest.raises(maxsim.InvalidArgumentError, match=r"documents\[1\] must be a 2-D"):
        maxsim.scores(Q, [docs[0], [1.0] * d])
    with pytest.raises(maxsim.InvalidArgumentError, match="as many query sets"):
        maxsim.pairs(Q, docs)
    with pytest.raises(maxsim.InvalidArgumentError, match="carries its own lengths"):
        maxsim.Sets(docs, lengths=[3, 0, 4, 6])
    with pytest.raises(maxsim.InvalidArgumentError, match="devices"):
        maxsim.scores(Q, docs, devices="0;1")


def test_pairs_and_candidates(rng):
    d = 24
    Q = rng.standard_normal((5, 8, d)).astype(np.float32)
    D = rng.standard_normal((5, 11, d)).astype(np.float32)
    S = maxsim.scores(Q, D)
    assert np.array_equal(maxsim.pairs(Q, D), np.diag(S))
    cand = rng.integers(0, 5, size=(5, 3))
    assert np.array_equal(maxsim.candidates(Q, D, cand), np.take_along_axis(S, cand, axis=1))
    lists = [[0, 4], [], [1, 1, 2], [3], [0]]
    flat = maxsim.candidates(Q, D, lists)
    assert np.array_equal(flat, np.concatenate([S[i, l] for i, l in enumerate(lists)]))
    # KD layout [Nq, K, Ld, d]
    KD = rng.standard_normal((5, 4, 11, d)).astype(np.float32)
    kd = maxsim.candidates(Q, KD)
    ref = np.array([[reference_matrix([Q[i]], [KD[i, k]])[0, 0] for k in range(4)] for i in range(5)])
    np.testing.assert_allclose(kd, ref, atol=tolerance(list(Q), list(D)), rtol=0)
    s, a = maxsim.candidates(Q, KD, return_argmax=True)
    assert a.shape == (5, 4, 8) and np.array_equal(s, kd)


def test_half_precision_inputs(rng):
    d = 48
    Q = rng.standard_normal((3, 7, d)).astype(np.float32)
    D = rng.standard_normal((4, 9, d)).astype(np.float32)
    Q16, D16 = Q.astype(np.float16), D.astype(np.float16)
    S16 = maxsim.scores(Q16, D16)
    ref = reference_matrix(list(Q16.astype(np.float64)), list(D16.astype(np.float64)))
    np.testing.assert_allclose(S16, ref, atol=tolerance(list(Q), list(D)), rtol=0)
    # bf16 storage through pack(dtype="bf16"): scores equal the reference on the rounded values.
    c = maxsim.pack(list(D), dtype="bf16")
    assert c.dtype == "bf16"
    bits = maxsim._api._bf16_bits(D).astype(np.uint32) << np.uint32(16)
    Dbf = bits.view(np.float32)
    np.testing.assert_allclose(maxsim.scores(Q, c), reference_matrix(list(Q), list(Dbf)), atol=tolerance(list(Q), list(D)), rtol=0)
    assert maxsim.pack(list(D), dtype="f16").dtype == "f16"


def test_pack_save_load_buffer_roundtrip(tmp_path, rng):
    D = ragged(rng, 9, 0, 20, 16)
    ids = np.arange(9, dtype=np.uint64) + 1000
    c = maxsim.pack(D, ids=ids)
    assert len(c) == 9 and c.dim == 16 and c.n_tokens == sum(len(x) for x in D)
    assert np.array_equal(c.lengths, [len(x) for x in D]) and np.array_equal(c.ids, ids)
    path = tmp_path / "c.maxsim"
    c.save(path)
    assert path.stat().st_size == c.nbytes
    Q = ragged(rng, 2, 1, 5, 16)
    ref = maxsim.scores(Q, c)
    for level in ("fast", "standard", "deep"):
        m = maxsim.load(path, validate=level)
        assert np.array_equal(maxsim.scores(Q, m), ref) and np.array_equal(m.ids, ids)
        m.validate(level)
        m.close()
    raw = path.read_bytes()
    b = maxsim.PackedCorpus.from_buffer(raw)
    assert np.array_equal(maxsim.scores(Q, b), ref)
    assert bytes(b.buffer()) == raw
    inplace = maxsim.PackedCorpus.from_buffer(c.buffer())  # aligned: wrapped without a copy
    assert inplace.buffer().ctypes.data == c.buffer().ctypes.data
    # Corruption is caught: flip a payload byte.
    bad = bytearray(raw)
    bad[len(bad) // 2] ^= 0x5A
    with pytest.raises(maxsim.CorruptBufferError):
        maxsim.PackedCorpus.from_buffer(bytes(bad))
    with pytest.raises(maxsim.CorruptBufferError):
        maxsim.PackedCorpus.from_buffer(raw[:100])


def test_zero_copy_reads_the_callers_buffer(rng):
    """A strided numpy view is read in place: scores follow a write to the caller's buffer, and scoring a
    64 MiB document array allocates nothing like its size (tracemalloc sees every numpy allocation)."""
    import tracemalloc

    big = rng.standard_normal((2 * 65536, 128)).astype(np.float32)  # 64 MiB
    view = big[::2]  # every other row: row stride 256 elements, not contiguous
    assert not view.flags.c_contiguous
    docs = maxsim.Sets(view, lengths=np.full(1024, 64))
    Q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    tracemalloc.start()
    S = maxsim.scores(Q, docs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak
    ref = reference_matrix(list(Q), [view[i * 64:(i + 1) * 64] for i in range(3)])
    np.testing.assert_allclose(S[0, :3], ref[0], atol=tolerance(list(Q), [view[:64]]), rtol=0)
    big[0] = 0.0  # row 0 of the view: document 0 changes, the skipped odd rows do not matter
    big[1] = 1e3
    S2 = maxsim.scores(Q, docs)
    assert S2[0, 0] != S[0, 0] and np.array_equal(S2[0, 1:], S[0, 1:])


def _c_api():
    """The C library inside the installed package, called through ctypes with the structs of maxsim.h."""
    lib = ctypes.CDLL(str(next(pathlib.Path(maxsim.__file__).parent.glob("libmaxsim.so*"))))

    class Dense(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("memory", ctypes.c_int32), ("data", ctypes.c_void_p),
                    ("dtype", ctypes.c_int32), ("dim", ctypes.c_uint32), ("row_stride", ctypes.c_uint64),
                    ("n_sets", ctypes.c_uint64), ("offsets", ctypes.c_void_p), ("set_length", ctypes.c_uint64),
                    ("mask", ctypes.c_void_p)]

    class Sets(ctypes.Structure):
        _fields_ = [("packed", ctypes.c_void_p), ("dense", ctypes.POINTER(Dense))]

    class ScoreOptions(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("metric", ctypes.c_int32), ("mode", ctypes.c_int32),
                    ("stats", ctypes.c_void_p), ("cuda_stream", ctypes.c_void_p)]

    return lib, Dense, Sets, ScoreOptions


def test_same_bits_as_the_c_api(real_data):
    lib, Dense, Sets, ScoreOptions = _c_api()
    ctx = ctypes.c_void_p()
    assert lib.maxsim_context_create(None, ctypes.byref(ctx)) == 0
    try:
        q, qo = real_data["queries_tokens"], real_data["queries_offsets"].astype(np.uint64)
        d, do = real_data["docs_tokens"], real_data["docs_offsets"].astype(np.uint64)

        def dense(tokens, offs):
            return Dense(ctypes.sizeof(Dense), 0, tokens.ctypes.data, 1, tokens.shape[1], 0, len(offs) - 1,
                         offs.ctypes.data, 0, None)

        qd, dd = dense(q, qo), dense(d, do)
        qs, ds = Sets(None, ctypes.pointer(qd)), Sets(None, ctypes.pointer(dd))
        for metric in (0, 1):
            opts = ScoreOptions(ctypes.sizeof(ScoreOptions), metric, 0, None, None)
            out = np.zeros((len(qo) - 1, len(do) - 1), np.float32)
            arg = np.zeros(out.size * 32, np.int32)
            st = lib.maxsim_score_matrix(ctx, ctypes.byref(qs), ctypes.byref(ds), ctypes.byref(opts),
                                         out.ctypes.data_as(ctypes.c_void_p), arg.ctypes.data_as(ctypes.c_void_p))
            assert st == 0
            S, A = maxsim.scores(maxsim.Sets(q, offsets=qo), maxsim.Sets(d, offsets=do),
                                 metric=("dot", "cosine")[metric], return_argmax=True)
            assert np.array_equal(S.view(np.uint32), out.view(np.uint32))
            assert np.array_equal(A, arg)
    finally:
        lib.maxsim_context_destroy(ctx)


def test_the_exported_inits_fill_only_the_first_layout(real_data):
    """A ctypes caller of maxsim_score_options_init / maxsim_options_init (the exported functions, not maxsim.h's
    macros) gets the first released layout filled and nothing written past it; the *_sized functions fill the
    size they are given; either struct then works."""
    lib, Dense, Sets, ScoreOptions = _c_api()

    class Guarded(ctypes.Structure):  # the first-layout struct, then bytes that must stay as they are
        _fields_ = [("o", ScoreOptions), ("canary", ctypes.c_uint64 * 2)]

    class ScoreOptionsFull(ctypes.Structure):
        _fields_ = ScoreOptions._fields_ + [("flags", ctypes.c_uint32)]

    class Options(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("num_threads", ctypes.c_int32), ("backend", ctypes.c_char_p),
                    ("isa", ctypes.c_char_p), ("plugin_path", ctypes.c_char_p), ("load_plugins", ctypes.c_uint32),
                    ("log", ctypes.c_void_p), ("log_user_data", ctypes.c_void_p)]

    class GuardedOptions(ctypes.Structure):
        _fields_ = [("o", Options), ("canary", ctypes.c_uint64 * 2)]

    canary = 0xA5A5A5A5A5A5A5A5
    g = Guarded()
    g.canary[0] = g.canary[1] = canary
    lib.maxsim_score_options_init(ctypes.byref(g.o))
    assert list(g.canary) == [canary, canary]
    assert g.o.struct_size == ctypes.sizeof(ScoreOptions) and g.o.metric == 0 and g.o.mode == 0
    go = GuardedOptions()
    go.canary[0] = go.canary[1] = canary
    lib.maxsim_options_init(ctypes.byref(go.o))
    assert list(go.canary) == [canary, canary]
    assert go.o.struct_size == ctypes.sizeof(Options) and go.o.load_plugins == 1
    full = ScoreOptionsFull()
    full.flags = 7
    lib.maxsim_score_options_init_sized(ctypes.byref(full), ctypes.c_size_t(ctypes.sizeof(full)))
    assert full.struct_size == ctypes.sizeof(full) and full.flags == 0

    go.o.backend = b"cpu"
    go.o.num_threads = 1
    ctx = ctypes.c_void_p()
    assert lib.maxsim_context_create(ctypes.byref(go.o), ctypes.byref(ctx)) == 0
    try:
        q, qo = real_data["queries_tokens"], real_data["queries_offsets"].astype(np.uint64)
        d, do = real_data["docs_tokens"], real_data["docs_offsets"].astype(np.uint64)
        qd = Dense(ctypes.sizeof(Dense), 0, q.ctypes.data, 1, q.shape[1], 0, len(qo) - 1, qo.ctypes.data, 0, None)
        dd = Dense(ctypes.sizeof(Dense), 0, d.ctypes.data, 1, d.shape[1], 0, len(do) - 1, do.ctypes.data, 0, None)
        qs, ds = Sets(None, ctypes.pointer(qd)), Sets(None, ctypes.pointer(dd))
        want = maxsim.scores(maxsim.Sets(q, offsets=qo), maxsim.Sets(d, offsets=do), metric="cosine")
        for opts in (g.o, full):
            opts.metric = 1  # cosine
            out = np.zeros((len(qo) - 1, len(do) - 1), np.float32)
            assert lib.maxsim_score_matrix(ctx, ctypes.byref(qs), ctypes.byref(ds), ctypes.byref(opts),
                                           out.ctypes.data_as(ctypes.c_void_p), None) == 0
            assert np.array_equal(want.view(np.uint32), out.view(np.uint32))
    finally:
        lib.maxsim_context_destroy(ctx)


def test_threads_backend_isa_options():
    ctx = maxsim.context(threads=1, backend="cpu", isa="scalar")
    assert ctx.threads == 1 and ctx.kernel == "scalar" and ctx.backend == "cpu"
    with pytest.raises(maxsim.BackendUnavailableError):
        maxsim.scores(np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32), backend="no-such-backend")
    with pytest.raises(maxsim.Error):
        maxsim.scores(np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32), isa="no-such-isa")


def test_string_ids_roundtrip_and_topk(real_data, tmp_path):
    names = real_data["doc_ids"]
    corpus = maxsim.pack(real_data["docs"], ids=names)
    assert corpus.string_ids == names and corpus.ids is None
    path = tmp_path / "named.maxsim"
    corpus.save(path)
    loaded = maxsim.load(path)
    assert loaded.string_ids == names
    top = maxsim.topk(real_data["queries"], loaded, 3)
    assert top.ids == [[names[j] for j in row] for row in top.indices.tolist()]
    assert maxsim.topk(real_data["queries"][0], loaded, 2).ids == [names[j] for j in top.indices[0, :2]]
    with pytest.raises(maxsim.InvalidArgumentError):
        maxsim.pack(real_data["docs"][:2], ids=["ok", "tab\there"])


class _DLPackOnly:
    """An object that only speaks DLPack (neither numpy nor torch)."""

    def __init__(self, a):
        self._a = a
        self.ndim, self.shape = a.ndim, a.shape

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_objects_are_read(rng):
    Q = rng.standard_normal((2, 5, 16)).astype(np.float32)
    D = rng.standard_normal((3, 7, 16)).astype(np.float32)
    got = maxsim.scores(_DLPackOnly(Q), _DLPackOnly(D))
    assert isinstance(got, np.ndarray) and np.array_equal(got, maxsim.scores(Q, D))
