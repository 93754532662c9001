# SPDX-License-Identifier: Apache-2.0
"""Bad input raises the right maxsim.Error subclass with the library's message, and failing calls leak nothing."""

from __future__ import annotations

import numpy as np
import pytest

import maxsim

Q = np.ones((2, 4, 8), np.float32)
D = np.ones((3, 5, 8), np.float32)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: maxsim.scores(Q.astype(np.float64), D), maxsim.InvalidArgumentError, "float32"),
        (lambda: maxsim.scores(Q.astype(np.int32), D), maxsim.InvalidArgumentError, "float32"),
        (lambda: maxsim.scores(np.ones(8, np.float32), D), maxsim.InvalidArgumentError, "dimensions"),
        (lambda: maxsim.scores(np.ones((1, 2, 3, 8), np.float32), D), maxsim.InvalidArgumentError, "dimensions"),
        (lambda: maxsim.scores(np.ones((2, 16), np.float32)[:, ::2], D), maxsim.InvalidArgumentError, "contiguous"),
        (lambda: maxsim.scores(Q, np.ones((3, 5, 9), np.float32)), maxsim.DimMismatchError, "dim"),
        (lambda: maxsim.scores(Q, D, mode="fast"), maxsim.InvalidArgumentError, "mode"),
        (lambda: maxsim.scores(Q, D, metric="l2"), maxsim.InvalidArgumentError, "metric"),
        (lambda: maxsim.scores(Q, D, d_mask=np.ones((3, 4), bool)), maxsim.InvalidArgumentError, "mask"),
        (lambda: maxsim.Sets(np.ones((4, 8), np.float32), offsets=[0, 2, 9]), maxsim.InvalidArgumentError, "offsets"),
        (lambda: maxsim.pack(np.ones((4, 8), np.float32), lengths=[2, 2], ids=[1]), maxsim.InvalidArgumentError, "ids"),
        (lambda: maxsim.topk(Q, D, -1), maxsim.InvalidArgumentError, "k"),
        (lambda: maxsim.load("/nonexistent/x.maxsim"), maxsim.FileError, "x.maxsim"),
        (lambda: maxsim.load("/dev/null"), maxsim.Error, ""),
        (lambda: maxsim.PackedCorpus.from_buffer(b"\0" * 256), maxsim.CorruptBufferError, ""),
        (lambda: maxsim.scores(Q, D, devices="0;1"), maxsim.InvalidArgumentError, "maxsim_options.devices"),
        (lambda: maxsim.info(devices="gpu0"), maxsim.InvalidArgumentError, "device ordinals"),
    ],
)
def test_bad_input_raises(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words.lower() in str(info.value).lower()
    assert isinstance(info.value, maxsim.Error)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e30])
def test_non_finite_rejected(value):
    bad = D.copy()
    bad[1, 2, 3] = value
    with pytest.raises(maxsim.NonFiniteError) as info:
        maxsim.scores(Q, bad)
    assert info.value.status_name == "MAXSIM_ERR_NON_FINITE"
    with pytest.raises(maxsim.NonFiniteError):
        maxsim.pack(bad)
    with pytest.raises(maxsim.NonFiniteError):
        maxsim.scores(bad, D)


def test_closed_corpus():
    c = maxsim.pack(list(D))
    c.close()
    assert c.closed
    with pytest.raises(maxsim.InvalidArgumentError, match="closed"):
        maxsim.scores(Q, c)
    with pytest.raises(maxsim.InvalidArgumentError, match="closed"):
        len(c)


def test_exceptions_are_builtin_compatible():
    with pytest.raises(ValueError):
        maxsim.scores(Q, D, mode="nope")
    with pytest.raises(OSError):
        maxsim.load("/nonexistent/y.maxsim")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_failing_calls_leak_nothing():
    bad = D.copy()
    bad[0, 0, 0] = np.nan
    corrupt = b"\0" * 4096
    packed = maxsim.pack(D)  # numpy queries against a packed corpus: the one-step top-k path

    def fail_all():
        for call in (lambda: maxsim.scores(Q, bad), lambda: maxsim.scores(Q, np.ones((3, 5, 9), np.float32)),
                     lambda: maxsim.PackedCorpus.from_buffer(corrupt), lambda: maxsim.pack(bad),
                     lambda: maxsim.topk(Q, bad, 3), lambda: maxsim.topk(bad, packed, 3)):
            try:
                call()
            except maxsim.Error:
                pass
            else:
                raise AssertionError("call did not fail")

    for _ in range(200):  # warm up allocator pools and caches
        fail_all()
    before = _rss_kib()
    for _ in range(2000):  # 10^4 failing calls
        fail_all()
    grown = _rss_kib() - before
    assert grown < 2048, f"RSS grew by {grown} KiB over 10^4 failing calls"


def test_devices_option_selects_a_context():
    # A well-formed device list is accepted (the CPU backend has no devices to shard over: same results).
    a = maxsim.scores(Q, D, backend="cpu", devices="0,0")
    b = maxsim.scores(Q, D, backend="cpu")
    assert np.array_equal(a, b)
    assert maxsim.context(backend="cpu", devices="0,0") is not maxsim.context(backend="cpu")


def test_stream_ordered_needs_device_tensors():
    # stream_ordered=True is for CUDA tensors (python/tests/test_cuda.py); host arrays are refused, naming the flag.
    rng = np.random.default_rng(5)
    Q, D = rng.standard_normal((2, 4, 16), dtype=np.float32), rng.standard_normal((3, 5, 16), dtype=np.float32)
    for call in (lambda: maxsim.scores(Q, D, stream_ordered=True), lambda: maxsim.pairs(Q, D[:2], stream_ordered=True),
                 lambda: maxsim.candidates(Q, D, [[0, 1], [2]], stream_ordered=True)):
        with pytest.raises(maxsim.InvalidArgumentError, match="MAXSIM_CALL_STREAM_ORDERED"):
            call()
    maxsim.synchronize()  # nothing was enqueued: returns at once
