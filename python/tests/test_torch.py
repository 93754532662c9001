# SPDX-License-Identifier: Apache-2.0
"""PyTorch: tensors in and out (zero copy on the CPU), autograd through the library's backward (gradcheck in
float64 on small shapes; einsum autograd in float32 on the real ColBERTv2 shapes), and deterministic gradients.
CUDA tensors route to the CUDA plugin; they are tested on a GPU machine only (skipped here without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

import maxsim  # noqa: E402
import maxsim.torch as mt  # noqa: E402
from conftest import real_batch  # noqa: E402


def einsum_maxsim(Q, D, q_mask=None, d_mask=None):
    sim = torch.einsum("qsd,ntd->qnst", Q, D)
    if d_mask is not None:
        sim = sim.masked_fill(~d_mask.bool()[None, :, None, :], float("-inf"))
    best = sim.max(dim=-1).values
    if q_mask is not None:
        best = best * q_mask.to(best.dtype)[:, None, :]
    return best.sum(-1)


def test_tensor_in_tensor_out_same_bits_as_numpy():
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(3, 8, 32, generator=g)
    D = torch.randn(5, 12, 32, generator=g)
    S = maxsim.scores(Q, D)
    assert isinstance(S, torch.Tensor) and S.shape == (3, 5) and S.dtype == torch.float32
    assert np.array_equal(S.numpy(), maxsim.scores(Q.numpy(), D.numpy()))
    for dt in (torch.float16, torch.bfloat16):
        got = maxsim.scores(Q.to(dt), D.to(dt))
        ref = einsum_maxsim(Q.to(dt).double(), D.to(dt).double()).float()
        torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-4)
    top = maxsim.topk(Q, maxsim.pack(D), 2)
    assert isinstance(top.scores, torch.Tensor) and top.indices.dtype == torch.int64


class _MyTensor(torch.Tensor):  # a subclass defined outside any torch module
    pass


def test_tensor_subclasses_are_torch_tensors():
    g = torch.Generator().manual_seed(3)
    Q, D = torch.randn(2, 4, 16, generator=g), torch.randn(3, 6, 16, generator=g)
    S = maxsim.scores(Q.as_subclass(_MyTensor), D.numpy())
    assert isinstance(S, torch.Tensor), type(S)
    assert np.array_equal(S.numpy(), maxsim.scores(Q.numpy(), D.numpy()))


def test_requires_grad_inputs_and_masks():
    g = torch.Generator().manual_seed(1)
    Q = torch.randn(2, 6, 16, generator=g, requires_grad=True)
    D = torch.randn(4, 9, 16, generator=g)
    d_mask = torch.ones(4, 9, dtype=torch.long)
    d_mask[1, 5:] = 0
    q_mask = torch.ones(2, 6, dtype=torch.bool)
    q_mask[0, 4:] = False
    S = maxsim.scores(Q, D, q_mask=q_mask, d_mask=d_mask)
    torch.testing.assert_close(S, einsum_maxsim(Q.detach(), D, q_mask, d_mask), atol=1e-5, rtol=1e-6)


def test_gradcheck_float64_small_shapes():
    # The library computes in float32: the float64 inputs are rounded to f32, so the numerical Jacobian is taken
    # with eps = 1e-3 (MaxSim is piecewise linear: exact away from argmax switches) and f32-level tolerances.
    g = torch.Generator().manual_seed(2)
    for (nq, lq, nd, ld, d) in [(2, 3, 3, 4, 5), (1, 1, 2, 7, 3), (3, 4, 1, 1, 8)]:
        Q = torch.randn(nq, lq, d, generator=g, dtype=torch.float64, requires_grad=True)
        D = torch.randn(nd, ld, d, generator=g, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda a, b: mt.maxsim(a, b), (Q, D), eps=1e-3, atol=2e-3, rtol=2e-3)
        assert torch.autograd.gradcheck(lambda a, b: mt.maxsim_pairs(a, b[:nq] if nd >= nq else b.repeat(nq, 1, 1)[:nq]),
                                        (Q, D), eps=1e-3, atol=2e-3, rtol=2e-3)
    d_mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    Q = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    D = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: mt.maxsim(a, b, d_mask=d_mask), (Q, D), eps=1e-3, atol=2e-3, rtol=2e-3)


def test_gradients_match_einsum_autograd_on_real_shapes(real_data):
    Q0, D0, mask = real_batch(real_data)
    w = torch.randn(Q0.shape[0], D0.shape[0], generator=torch.Generator().manual_seed(3))
    Q1, D1 = Q0.clone().requires_grad_(), D0.clone().requires_grad_()
    (mt.maxsim(Q1, D1, d_mask=mask) * w).sum().backward()
    Q2, D2 = Q0.clone().requires_grad_(), D0.clone().requires_grad_()
    (einsum_maxsim(Q2, D2, d_mask=mask) * w).sum().backward()
    torch.testing.assert_close(Q1.grad, Q2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(D1.grad, D2.grad, atol=1e-5, rtol=1e-5)
    assert torch.all(D1.grad[~mask] == 0)


def test_backward_is_deterministic_across_threads(real_data):
    Q0, D0, mask = real_batch(real_data)
    grads = []
    for threads in (1, 2, 2):
        Q, D = Q0.clone().requires_grad_(), D0.clone().requires_grad_()
        mt.maxsim(Q, D, d_mask=mask, threads=threads).sum().backward()
        grads.append((Q.grad, D.grad))
    for gq, gd in grads[1:]:
        assert torch.equal(gq, grads[0][0]) and torch.equal(gd, grads[0][1])


def test_cpu_tensor_zero_copy():
    D = torch.randn(64, 16, 32)
    before = maxsim.scores(torch.ones(1, 2, 32), D)
    D[3] += 100.0  # the library reads D's storage: the change shows without re-wrapping anything
    after = maxsim.scores(torch.ones(1, 2, 32), D)
    assert after[0, 3] != before[0, 3] and torch.equal(after[0, :3], before[0, :3])


def test_list_of_cpu_tensors_read_in_place():
    # PyLate's documents_embeddings: a list of [L_i, d] tensors, read in place (one pointer per document) in
    # float32 and bfloat16, the same bits as the concatenated tensor, torch out; a write to one shows next call.
    g = torch.Generator().manual_seed(3)
    Q = torch.randn(2, 8, 32, generator=g)
    docs = [torch.randn(int(n), 32, generator=g) for n in (5, 0, 17, 9, 30)]
    lengths = [len(x) for x in docs]
    for dt in (torch.float32, torch.bfloat16):
        typed = [x.to(dt) for x in docs]
        got = maxsim.scores(Q.to(dt), typed)
        want = maxsim.scores(Q.to(dt), maxsim.Sets(torch.cat(typed), lengths=lengths))
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), dt
    before = maxsim.scores(Q, docs)
    docs[2][0] += 100.0
    after = maxsim.scores(Q, docs)
    assert not torch.equal(after[:, 2], before[:, 2]) and torch.equal(after[:, 3:], before[:, 3:])
    with_grad = [x.clone().requires_grad_(True) for x in docs]  # DLPack refuses these: concatenated, detached
    assert torch.equal(maxsim.scores(Q, with_grad), after)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (the CUDA plugin path runs on GPU hosts)")
def test_cuda_tensors_stay_on_device():
    Q = torch.randn(2, 8, 64, device="cuda")
    D = torch.randn(3, 20, 64, device="cuda")
    S = maxsim.scores(Q, D)
    assert S.is_cuda
    torch.testing.assert_close(S.cpu(), maxsim.scores(Q.cpu(), D.cpu()))


def test_cuda_topk_ranking_logic_on_the_cpu():
    # maxsim.topk on CUDA tensors ranks a device score matrix with a stable sort (CUDA documents) or sends host
    # copies of the queries to the library's top-k (a packed corpus). Both branches run here on CPU tensors marked
    # as CUDA, so their ranking, padding, squeezing and ids are checked without a GPU (test_cuda.py runs them on one).
    from maxsim import _api

    def as_cuda(side):
        return side._replace(where=side.where._replace(cuda=True))

    g = torch.Generator().manual_seed(4)
    Q, D = torch.randn(4, 16, 32, generator=g), torch.randn(30, 20, 32, generator=g)
    D[17] = D[3]  # a tie: the lower index first
    D[25, :] = 0.0  # all-zero document: score 0
    corpus = maxsim.pack(D, ids=np.arange(100, 130, dtype=np.uint64))
    q_mask = torch.ones(4, 16, dtype=torch.bool)
    q_mask[1, 9:] = False
    for k in (1, 5, 30, 37):
        cpu = maxsim.topk(Q, corpus, k, q_mask=q_mask)
        q = as_cuda(_api._side(Q, q_mask, "queries"))
        dense = _api._topk_cuda(q, as_cuda(_api._side(D, None, "corpus")), k, "dot", "exact", False, 0, None, None)
        packed = _api._topk_cuda(q, _api._side(corpus, None, "corpus"), k, "dot", "exact", False, 0, None, None)
        for top in (dense, packed):
            assert torch.equal(top.scores, cpu.scores) and torch.equal(top.indices, cpu.indices)
        assert dense.ids is None and torch.equal(packed.ids, cpu.ids)
    # scores/pairs/candidates: a CUDA side against a packed corpus becomes a host copy, outputs go back to it.
    q, d, back = _api._host_for_packed(as_cuda(_api._side(Q, q_mask, "queries")), _api._side(corpus, None, "c"))
    assert not q.where.cuda and back == Q.device and q.keep is not None and q.length == 16
    assert torch.equal(maxsim.scores(q.keep, corpus), maxsim.scores(Q, corpus, q_mask=q_mask))
    q2, d2, back = _api._host_for_packed(as_cuda(_api._side(Q, None, "queries")), as_cuda(_api._side(D, None, "d")))
    assert back is None and q2.where.cuda  # two tensors: nothing is copied
    one = _api._topk_cuda(as_cuda(_api._side(Q[0], None, "queries")), as_cuda(_api._side(D, None, "corpus")), 5,
                          "dot", "exact", True, 0, None, None)
    assert one[0].scores.shape == (5,) and isinstance(one[1], dict)
    assert torch.equal(one[0].indices, maxsim.topk(Q[0], corpus, 5).indices)


@pytest.mark.parametrize("block_pairs", [1, 7, 64, 1 << 24])
def test_cuda_topk_blocks_merge_exactly(monkeypatch, block_pairs):
    # topk on CUDA documents scores blocks of at most _TOPK_BLOCK_PAIRS (query, document) pairs and merges each
    # into the running top-k: the same scores and indices as one stable sort of the whole matrix, whatever the
    # block size (ties across block boundaries, empty and masked documents, ragged sets, k past the corpus end).
    # CPU tensors marked as CUDA run the same code here; test_cuda.py runs it on a GPU.
    from maxsim import _api

    def as_cuda(side):
        return side._replace(where=side.where._replace(cuda=True))

    g = torch.Generator().manual_seed(5)
    Q = torch.randint(-2, 3, (5, 6, 16), generator=g).float()  # integer tokens: many exact ties
    D = torch.randint(-2, 3, (23, 9, 16), generator=g).float()
    D[11], D[19], D[22] = D[2], D[2], D[2]
    d_mask = torch.ones(23, 9, dtype=torch.bool)
    d_mask[4, 3:] = False
    d_mask[7] = False  # an empty document
    lengths = [9, 1, 0, 5, 9, 2, 9, 3, 9, 9, 4, 9, 9, 9, 9, 9, 9, 8, 9, 9, 9, 9, 9]
    ragged = [D[i, :n] for i, n in enumerate(lengths)]
    q_mask = torch.ones(5, 6, dtype=torch.bool)
    q_mask[3, 2:] = False

    def full_sort(S, k):  # the reference: one stable descending sort of the whole score matrix
        vals, idx = torch.sort(S, dim=1, descending=True, stable=True)
        pad = max(0, k - S.shape[1])
        vals = torch.cat([vals[:, :k], torch.full((S.shape[0], pad), float("-inf"))], dim=1)
        idx = torch.cat([idx[:, :k], torch.full((S.shape[0], pad), -1, dtype=torch.int64)], dim=1)
        return vals, idx

    monkeypatch.setattr(_api, "_TOPK_BLOCK_PAIRS", block_pairs)
    for docs, d_m in ((D, d_mask), (ragged, None), (maxsim.Sets(torch.cat(ragged), lengths=lengths), None)):
        q = as_cuda(_api._side(Q, q_mask, "queries"))
        d = as_cuda(_api._side(docs, d_m, "corpus"))
        S = maxsim.scores(Q, docs, q_mask=q_mask, d_mask=d_m)
        for k in (0, 1, 4, 23, 30):
            top, stats = _api._topk_cuda(q, d, k, "dot", "exact", True, 0, None, None)
            vals, idx = full_sort(S, k)
            assert torch.equal(top.scores, vals) and torch.equal(top.indices, idx), (block_pairs, k)
            assert stats["pairs"] == 5 * 23, stats
    # Packed queries against CUDA documents: the queries are not split, the documents are.
    packed_q = _api._side(maxsim.pack(Q, mask=q_mask), None, "queries")
    top = _api._topk_cuda(packed_q, as_cuda(_api._side(D, d_mask, "corpus")), 7, "dot", "exact", False, 0, None, None)
    vals, idx = full_sort(maxsim.scores(Q, D, q_mask=q_mask, d_mask=d_mask), 7)
    assert torch.equal(top.scores, vals) and torch.equal(top.indices, idx)
    one = _api._topk_cuda(as_cuda(_api._side(Q[0], None, "q")), as_cuda(_api._side(D, d_mask, "c")), 6, "dot",
                          "exact", False, 0, None, None)
    vals, idx = full_sort(maxsim.scores(Q[0:1], D, d_mask=d_mask), 6)
    assert torch.equal(one.scores, vals[0]) and torch.equal(one.indices, idx[0])


def test_cuda_device_routing_logic_on_the_cpu():
    # Dense CUDA tensors run on the GPU they live on: devices=None becomes their ordinal, an explicit list must
    # start with it, and tensors of one call on two GPUs are refused (never read through the wrong device).
    # torch.device values stand for the tensors here; test_cuda.py runs the real calls on one and on two GPUs.
    from maxsim import _api

    c0, c1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert _api._cuda_devices([c1], None) == "1"
    assert _api._cuda_devices([c1, c1], "") == "1"
    assert _api._cuda_devices([c0, c0], "0") == "0"
    assert _api._cuda_devices([c1], "1,0") == "1,0"
    with pytest.raises(maxsim.InvalidArgumentError, match=r"devices='1' runs dense CUDA tensors on device 1"):
        _api._cuda_devices([c0], "1")
    with pytest.raises(maxsim.InvalidArgumentError, match=r"devices='0,1'"):
        _api._cuda_devices([c1, c1], "0,1")
    with pytest.raises(maxsim.InvalidArgumentError, match=r"live on cuda:0 and on cuda:1"):
        _api._cuda_devices([c0, c1], None)
    with pytest.raises(maxsim.InvalidArgumentError, match=r"live on cuda:1 and on cuda:0"):
        _api._cuda_devices([c1, c0], "1")
    # _route reads the sides' devices; host sides (numpy, CPU tensors, packed corpora) leave devices alone.
    Q, D = torch.randn(2, 4, 8), torch.randn(3, 5, 8)

    def on(side, device):
        return side._replace(where=side.where._replace(cuda=True, device=device))

    q, d = _api._side(Q, None, "queries"), _api._side(D, None, "documents")
    assert _api._route(q, d, None) is None and _api._route(q, d, "0,1") == "0,1"
    assert _api._route(on(q, c1), on(d, c1), None) == "1"
    with pytest.raises(maxsim.InvalidArgumentError, match="cuda:0 and on cuda:1"):
        _api._route(on(q, c0), on(d, c1), None)
    corpus = maxsim.pack(D)
    assert _api._route(*_api._host_for_packed(on(q, c1), _api._side(corpus, None, "c"))[:2], "0") == "0"
    # A list of tensors on two devices is refused before anything is concatenated.
    with pytest.raises(maxsim.InvalidArgumentError, match=r"documents\[1\] lives on meta but documents\[0\] on cpu"):
        maxsim.scores(Q, [D[0], D[1].to("meta")])
