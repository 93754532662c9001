# SPDX-License-Identifier: Apache-2.0
"""maxsim.distributed on a local Ray instance: 2 shard actors give results bit-identical to one process, a dead
replica fails over, and a shard with no live replica raises instead of returning a partial result. Skipped with a
message when Ray is not installed."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install ray)")

import maxsim  # noqa: E402
import maxsim.distributed as md  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 60, size=300)
    tokens = rng.standard_normal((int(lengths.sum()), 64)).astype(np.float32)
    tokens[:200] = tokens[200:400]  # duplicate documents: exact score ties across shards
    ids = np.arange(300, dtype=np.uint64) * 3 + 1
    directory = tmp_path_factory.mktemp("shards")
    md.write_shards(tokens, directory, 2, lengths=lengths, ids=ids)
    whole = maxsim.pack(tokens, lengths=lengths, ids=ids)
    Q = rng.standard_normal((7, 32, 64)).astype(np.float32)
    return directory, whole, Q


def test_two_workers_bit_identical_to_one_process(local_ray, corpus):
    directory, whole, Q = corpus
    shards = md.read_manifest(directory)
    assert len(shards) == 2 and sum(c for _, _, c in shards) == 300
    index = md.ShardedIndex(directory, threads=1)
    try:
        for mode in ("exact", "certified"):
            for k in (1, 10, 400):
                got = index.topk(Q, k, mode=mode)
                want = maxsim.topk(Q, whole, k, mode=mode)
                assert np.array_equal(got.scores.view(np.uint32), want.scores.view(np.uint32))
                assert np.array_equal(got.indices, want.indices)
                assert np.array_equal(got.ids[got.indices >= 0], want.ids[want.indices >= 0])
        one = index.topk(Q[0], 5)
        assert np.array_equal(one.indices, maxsim.topk(Q[0], whole, 5).indices)
    finally:
        index.close()


def _kill(actor) -> None:
    """Kills a shard actor and waits until a call on it fails: ray.kill returns before the actor has stopped, and a
    call made in between may still be answered."""
    ray.kill(actor)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.info.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    pytest.fail("a killed shard actor still answers after 60 s")


def test_failover_and_no_partial_results(local_ray, corpus):
    directory, whole, Q = corpus
    index = md.ShardedIndex(directory, replicas=2, threads=1, actor_options={"num_cpus": 0.5})
    try:
        want = maxsim.topk(Q, whole, 10)
        _kill(index.actors[0][0])  # shard 0 loses a replica: the other one answers
        got = index.topk(Q, 10)
        assert np.array_equal(got.indices, want.indices) and np.array_equal(got.scores, want.scores)
        for a in index.actors[1]:  # shard 1 loses every replica: an error, never a partial answer
            _kill(a)
        with pytest.raises(md.ShardUnavailableError, match="shard 1"):
            index.topk(Q, 10)
    finally:
        index.close()
