# SPDX-License-Identifier: Apache-2.0
"""Exact top-k over corpora split into shards, served by Ray actors.

    shards = maxsim.distributed.write_shards(corpus_tokens, "/data/corpus", n_shards=8, lengths=lengths)
    ray.init()                                                   # or ray.init(address="auto") on a cluster
    index = maxsim.distributed.ShardedIndex("/data/corpus", replicas=2)
    top = index.topk(Q, k=10, mode="certified")                   # the same bits as maxsim.topk on one corpus

Each shard is a packed corpus file holding a contiguous range of the documents; every actor memory-maps one
shard (``maxsim.load``: read-only, shared page cache between actors on one node). A query batch is put into the
object store once and sent to one replica of every shard; each returns its exact top-k with global document
numbers, and the merge orders by score, then by the lower global number, which is exactly the single-corpus
order: scores are bit-identical wherever they are computed (exact and certified modes give the same bits on
every kernel and thread count), so the merged result is bit-identical to ``maxsim.topk`` on the whole corpus.

Failure: a call to a dead actor (process or node lost) is retried on the shard's next replica; when no replica
of a shard answers, the call raises :class:`ShardUnavailableError` naming the shard. A partial result is never
returned. docs/python.md describes a multi-node deployment.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _api
from ._errors import Error, InvalidArgumentError

MANIFEST = "manifest.json"


class ShardUnavailableError(Error, RuntimeError):
    """Every replica of a shard failed: the query has no complete answer."""


def write_shards(tokens: Any, directory: Union[str, os.PathLike], n_shards: int, *, offsets: Any = None,
                 lengths: Any = None, mask: Any = None, ids: Any = None, dtype: Optional[str] = None) -> list[str]:
    """Packs token sets (anything :func:`maxsim.pack` takes) into ``n_shards`` shard files of contiguous document
    ranges (balanced by token count) under ``directory``, plus ``manifest.json`` (shard files, first global
    document number and count of each). Returns the shard paths."""
    n_shards = int(n_shards)
    if n_shards < 1:
        raise InvalidArgumentError(f"n_shards is {n_shards}; it must be >= 1")
    sets = _api.Sets(tokens, offsets=offsets, lengths=lengths, mask=mask) if not isinstance(tokens, _api.Sets) else tokens
    data, offs, m = sets._keep
    if isinstance(data, (list, tuple)):  # a list read in place: shards slice one array, so concatenate it here
        data, offs, _ = _api._concat(data, "tokens")
    if data.ndim == 3:
        n, L = data.shape[0], data.shape[1]
        offs = np.arange(n + 1, dtype=np.uint64) * np.uint64(L)
        data = data.reshape(n * L, data.shape[2])
    elif offs is None:
        offs = np.array([0, data.shape[0]], dtype=np.uint64)
    n = len(offs) - 1
    if ids is not None and len(ids) != n:
        raise InvalidArgumentError(f"ids has {len(ids)} entries for {n} documents")
    # Balanced by tokens: shard s ends at the first document whose end offset reaches s/n_shards of the tokens.
    first_row, last_row = int(offs[0]), int(offs[-1])
    targets = first_row + (last_row - first_row) * np.arange(1, n_shards) / n_shards
    ends = [0] + [int(c) for c in np.searchsorted(offs[1:], targets, side="left") + 1] + [n]
    cuts = np.maximum.accumulate(np.minimum(ends, n))
    os.makedirs(directory, exist_ok=True)
    entries, paths = [], []
    for s in range(n_shards):
        a, b = int(cuts[s]), int(cuts[s + 1])
        shard_offsets = (offs[a:b + 1] - offs[a]).astype(np.uint64)
        rows = data[int(offs[a]):int(offs[b])]
        shard_mask = None if m is None else np.asarray(m)[int(offs[a]):int(offs[b])]
        shard_ids = None if ids is None else list(ids[a:b]) if not isinstance(ids, np.ndarray) else ids[a:b]
        corpus = _api.pack(rows, offsets=shard_offsets, mask=shard_mask, ids=shard_ids, dtype=dtype)
        name = f"shard-{s:05d}.maxsim"
        path = os.path.join(os.fspath(directory), name)
        corpus.save(path)
        corpus.close()
        entries.append({"file": name, "first": a, "count": b - a})
        paths.append(path)
    manifest = {"format": "maxsim-shards/1", "n_documents": n, "shards": entries}
    tmp = os.path.join(os.fspath(directory), MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(os.fspath(directory), MANIFEST))
    return paths


def read_manifest(directory: Union[str, os.PathLike]) -> list[tuple[str, int, int]]:
    """(path, first global document number, count) of every shard in a write_shards directory."""
    with open(os.path.join(os.fspath(directory), MANIFEST)) as f:
        manifest = json.load(f)
    if manifest.get("format") != "maxsim-shards/1":
        raise InvalidArgumentError(f"{directory}: {MANIFEST} is not a maxsim shard manifest")
    return [(os.path.join(os.fspath(directory), e["file"]), int(e["first"]), int(e["count"])) for e in manifest["shards"]]


class _Shard:
    """The actor body: one memory-mapped shard."""

    def __init__(self, path: str, first: int, threads: int, validate: str):
        import maxsim

        self.corpus = maxsim.load(path, validate=validate)
        self.first = first
        self.threads = threads

    def info(self) -> tuple[int, int, int]:
        return os.getpid(), len(self.corpus), self.corpus.dim

    def topk(self, queries: tuple, k: int, mode: str, metric: str) -> tuple:
        import maxsim

        tokens, offsets = queries
        top = maxsim.topk(maxsim.Sets(tokens, offsets=offsets), self.corpus, k, mode=mode, metric=metric,
                          threads=self.threads)
        index = top.indices.copy()
        index[index >= 0] += self.first
        ids = top.ids
        return top.scores, index, ids


def _query_batch(Q: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    """(tokens [rows, d] float32/16, offsets, single) from the inputs maxsim.topk takes (host copies for Ray)."""
    if _api._is_torch(Q):
        Q = Q.detach().cpu().numpy() if Q.dtype.is_floating_point and str(Q.dtype) != "torch.bfloat16" else Q.detach().float().cpu().numpy()
    if isinstance(Q, (list, tuple)):
        parts = [np.asarray(p.detach().cpu().numpy() if _api._is_torch(p) else p) for p in Q]
        lengths = [len(p) for p in parts]
        tokens = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
        return np.ascontiguousarray(tokens), _api._offsets_from_lengths(lengths), False
    a = np.asarray(Q)
    if a.ndim == 2:
        return np.ascontiguousarray(a), np.array([0, a.shape[0]], dtype=np.uint64), True
    if a.ndim == 3:
        n, L = a.shape[0], a.shape[1]
        return np.ascontiguousarray(a.reshape(n * L, a.shape[2])), np.arange(n + 1, dtype=np.uint64) * np.uint64(L), False
    raise InvalidArgumentError(f"queries must be [L, d], [n, L, d] or a list of [L_i, d] arrays (got {a.ndim} dimensions)")


class ShardedIndex:
    """Ray actors serving the shards of a :func:`write_shards` directory (or explicit (path, first, count)
    triples). ``replicas`` actors per shard (failover); ``threads`` per actor (0: the library's default);
    ``actor_options`` go to Ray's ``.options()`` (e.g. ``num_cpus``, ``resources``, a scheduling strategy that
    pins shards to the nodes holding their files)."""

    def __init__(self, shards: Union[str, os.PathLike, Sequence[tuple[str, int, int]]], *, replicas: int = 1,
                 threads: int = 0, validate: str = "standard", actor_options: Optional[dict] = None):
        import ray

        self._ray = ray
        if isinstance(shards, (str, os.PathLike)):
            shards = read_manifest(shards)
        self.shards = [(os.fspath(p), int(first), int(count)) for p, first, count in shards]
        if not self.shards:
            raise InvalidArgumentError("no shards")
        if int(replicas) < 1:
            raise InvalidArgumentError(f"replicas is {replicas}; it must be >= 1")
        options = {"num_cpus": 1, **(actor_options or {})}
        remote = ray.remote(_Shard).options(**options)
        # Ray's stubs type neither actor handles' method .remote() nor ray.kill's argument: handles are Any here.
        self.actors: list[list[Any]] = [[remote.remote(p, first, threads, validate) for _ in range(int(replicas))]
                       for p, first, _ in self.shards]
        self.n_documents = sum(count for _, _, count in self.shards)
        # Every actor has loaded and validated its shard before the index is used (errors surface here).
        infos = ray.get([a.info.remote() for row in self.actors for a in row])
        dims = {d for _, _, d in infos}
        if len(dims) > 1:
            raise InvalidArgumentError(f"shards have different dimensions {sorted(dims)}")

    def _call_shard(self, s: int, query_ref: Any, k: int, mode: str, metric: str) -> tuple:
        ray = self._ray
        errors = []
        for actor in self.actors[s]:
            try:
                return ray.get(actor.topk.remote(query_ref, k, mode, metric))
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as e:
                errors.append(type(e).__name__)
        raise ShardUnavailableError(
            f"shard {s} ({self.shards[s][0]}): all {len(self.actors[s])} replicas failed ({', '.join(errors)}); "
            "no partial result is returned")

    def topk(self, Q: Any, k: int, *, mode: str = "exact", metric: str = "dot") -> _api.TopK:
        """Exact merged top-k over every shard: scores [Nq, k] float32, global indices [Nq, k] int64 (-1 past
        the corpus end), ids (the shards' ids, when they have them). A 2-D query drops the query axis."""
        ray = self._ray
        k = int(k)
        if k < 0:
            raise InvalidArgumentError(f"k is {k}; it must be >= 0")
        tokens, offsets, single = _query_batch(Q)
        nq = len(offsets) - 1
        query_ref = ray.put((tokens, offsets))
        # Fan out to one replica of each shard at once; retry a failed shard on its other replicas.
        first_try = [self.actors[s][0].topk.remote(query_ref, k, mode, metric) for s in range(len(self.shards))]
        parts = []
        for s, ref in enumerate(first_try):
            try:
                parts.append(ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError):
                self.actors[s] = self.actors[s][1:] + self.actors[s][:1]  # the failed replica goes last
                parts.append(self._call_shard(s, query_ref, k, mode, metric))
        scores = np.concatenate([p[0] for p in parts], axis=1) if parts else np.zeros((nq, 0), np.float32)
        index = np.concatenate([p[1] for p in parts], axis=1) if parts else np.zeros((nq, 0), np.int64)
        has_ids = all(p[2] is not None for p in parts)
        numeric_ids = has_ids and all(isinstance(p[2], np.ndarray) for p in parts)
        out_s = np.full((nq, k), -np.inf, dtype=np.float32)
        out_i = np.full((nq, k), -1, dtype=np.int64)
        out_ids: Any = np.full((nq, k), np.iinfo(np.uint64).max, dtype=np.uint64) if numeric_ids else ([[None] * k for _ in range(nq)] if has_ids else None)
        all_ids: Any = None
        if numeric_ids:
            all_ids = np.concatenate([p[2] for p in parts], axis=1)
        elif has_ids:
            all_ids = [sum((p[2][i] for p in parts), []) for i in range(nq)]
        for i in range(nq):
            valid = index[i] >= 0
            cand = np.nonzero(valid)[0]
            # Score descending, then the lower global document number: maxsim.topk's order on one corpus.
            order = cand[np.lexsort((index[i, cand], -scores[i, cand].astype(np.float64)))][:k]
            m = len(order)
            out_s[i, :m] = scores[i, order]
            out_i[i, :m] = index[i, order]
            if numeric_ids:
                out_ids[i, :m] = all_ids[i, order]
            elif has_ids:
                out_ids[i][:m] = [all_ids[i][j] for j in order]
        if single:
            return _api.TopK(out_s[0], out_i[0], None if out_ids is None else out_ids[0])
        return _api.TopK(out_s, out_i, out_ids)

    def close(self) -> None:
        for row in self.actors:
            for a in row:
                self._ray.kill(a)
        self.actors = []
