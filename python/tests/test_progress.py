# SPDX-License-Identifier: Apache-2.0
"""Progress and cancellation: the library's progress callback (maxsim_set_progress) drives a tqdm-like bar,
Ctrl-C (SIGINT) cancels a long call within a fraction of its run time, and an exception raised by the bar
cancels the call and propagates."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import maxsim


@pytest.fixture(scope="module")
def long_job():
    # Exact scoring on one thread; T1 = the time of the first eighth of the documents, so the whole call takes
    # about 8 * T1 on whatever CPU (and load) runs the test. A cancelled call must stop far earlier than that.
    rng = np.random.default_rng(5)
    Q = rng.standard_normal((64, 32, 128)).astype(np.float32)
    D = rng.standard_normal((2000, 100, 128)).astype(np.float32)
    t0 = time.perf_counter()
    maxsim.scores(Q, D[:250], threads=1)
    return Q, D, time.perf_counter() - t0


@pytest.fixture
def python_sigint():
    # Python installs its KeyboardInterrupt handler only where SIGINT was not ignored at start-up: a test run
    # started as a background job (`cmd &` in a script, nohup) inherits SIG_IGN and Ctrl-C would never arrive.
    # These tests are about the library's reaction to KeyboardInterrupt, so they install Python's handler.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


class Bar:
    def __init__(self, fail_after=None):
        self.n = 0
        self.calls = 0
        self.fail_after = fail_after

    def update(self, n):
        self.calls += 1
        self.n += n
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("bar says stop")


def test_progress_bar_advances_and_results_are_unchanged(long_job):
    Q, D, _ = long_job
    q, d = Q[:16], D  # 26 GFLOP: well over the 50 ms before the first report on any CPU
    bar = Bar()
    with_bar = maxsim.scores(q, d, threads=1, progress=bar)
    assert bar.calls >= 1 and 0 < bar.n <= 16 * 2000
    assert np.array_equal(with_bar, maxsim.scores(q, d, threads=1))
    corpus = maxsim.pack(d, progress=Bar())
    assert np.array_equal(corpus.buffer(), maxsim.pack(d).buffer())
    top_bar = Bar()
    top = maxsim.topk(q, corpus, 5, threads=1, progress=top_bar)
    assert np.array_equal(top.indices, maxsim.topk(q, corpus, 5, threads=1).indices)
    assert top_bar.n <= 16 * 2000


def test_exception_in_bar_cancels(long_job):
    Q, D, t1 = long_job
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="bar says stop"):
        maxsim.scores(Q, D, threads=1, progress=Bar(fail_after=1))
    elapsed = time.perf_counter() - t0
    assert elapsed < 4 * t1 + 0.1, f"cancelled call ran {elapsed:.2f} s; the whole call takes about {8 * t1:.2f} s"


def ctrl_c_during(call, t1):
    """Sends SIGINT t1 seconds into call(), which must raise KeyboardInterrupt long before it would have ended."""
    timer = threading.Timer(t1, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    elapsed = time.perf_counter() - t0
    assert elapsed < 5 * t1 + 0.1, f"the call ran {elapsed:.2f} s (Ctrl-C at {t1:.2f} s, whole call about {8 * t1:.2f} s)"


def test_ctrl_c_cancels_a_long_call(long_job, python_sigint):
    Q, D, t1 = long_job
    ctrl_c_during(lambda: maxsim.scores(Q, D, threads=1), t1)
    # The library is usable afterwards and the callback is gone.
    assert maxsim.scores(Q[:1, :4], D[:3]).shape == (1, 3)


def test_ctrl_c_cancels_a_long_call_on_a_list_of_documents(long_job, python_sigint):
    # A list of numpy documents is read in place (one pointer per document) by one library call, which Ctrl-C
    # cancels through the progress callback.
    Q, D, t1 = long_job
    docs = list(D)
    ctrl_c_during(lambda: maxsim.scores(Q, docs, threads=1), t1)
    assert maxsim.scores(Q[:1, :4], docs[:3]).shape == (1, 3)


def test_progress_argument_checked():
    with pytest.raises(maxsim.InvalidArgumentError, match="progress"):
        maxsim.scores(np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32), progress="yes")


def test_tqdm_bar(long_job, capsys):
    pytest.importorskip("tqdm", reason="tqdm is not installed")
    Q, D, _ = long_job
    S = maxsim.scores(Q[:4], D[:500], threads=1, progress=True)
    err = capsys.readouterr().err
    assert "scores" in err and "2.00k/2.00k" in err, err[-300:]
    assert S.shape == (4, 500)
