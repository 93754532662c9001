# SPDX-License-Identifier: Apache-2.0
"""The public functions: input normalisation (numpy, torch, DLPack, lists of per-document arrays, [n, L, d] +
mask), output allocation in the caller's framework and device, and the calls into maxsim._core. No scoring
arithmetic happens here: every number comes from the C library."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, NamedTuple, Optional, Sequence, Union, cast

import numpy as np

from . import _core
from ._errors import Error, InvalidArgumentError

_METRICS = {"dot": 0, "cosine": 1}
_MODES = {"exact": 0, "certified": 1, "approximate": 2}
_DTYPE_NAMES = {1: "f32", 2: "f16", 3: "bf16"}
_LAYOUTS = {"matrix": 0, "pairs": 1, "candidates": 2}

# ---------------------------------------------------------------------------------------------------------------
# Contexts: one per (threads, backend, isa, devices), created on first use. Environment variables (MAXSIM_NUM_THREADS,
# MAXSIM_BACKEND, MAXSIM_ISA, MAXSIM_PLUGIN_PATH) apply where an option is left at its default.
# ---------------------------------------------------------------------------------------------------------------
_contexts: dict[tuple, _core.Context] = {}
_contexts_lock = threading.Lock()


def context(threads: int = 0, backend: Optional[str] = None, isa: Optional[str] = None,
            devices: Optional[str] = None) -> _core.Context:
    """The shared context for these options (threads=0: MAXSIM_NUM_THREADS or OpenMP's default; backend/isa
    None: MAXSIM_BACKEND / MAXSIM_ISA or automatic; devices: the accelerator devices, e.g. "0,1" to shard packed
    corpora over two GPUs with results bit-identical to one, None: the backend's default, MAXSIM_CUDA_DEVICES)."""
    key = (int(threads), backend or "", isa or "", devices or "")
    ctx = _contexts.get(key)
    if ctx is None:
        with _contexts_lock:
            ctx = _contexts.get(key)
            if ctx is None:
                ctx = _core.Context(threads=key[0], backend=key[1], isa=key[2], devices=key[3])
                _contexts[key] = ctx
    return ctx


def _enum(table: dict, value: str, what: str) -> int:
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"{what} {value!r} is not one of {', '.join(map(repr, table))}") from None


# ---------------------------------------------------------------------------------------------------------------
# Frameworks
# ---------------------------------------------------------------------------------------------------------------
def _is_torch(x: Any) -> bool:
    # A tensor exists only once torch is imported; maxsim never imports torch for a caller who does not use it.
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)  # None too while torch is only partly imported
    return isinstance(tensor, type) and isinstance(x, tensor)


class _TorchHooks(NamedTuple):
    """torch's C entry points that the CUDA path calls per call, looked up once (None where this torch lacks one)."""
    to_dlpack: Any
    raw_stream: Any
    exchange_device: Any
    maybe_exchange_device: Any
    strided: Any
    dtypes: dict


_torch_hooks: Optional[_TorchHooks] = None


def _hooks() -> _TorchHooks:
    global _torch_hooks
    if _torch_hooks is None:
        import torch

        c = torch._C
        _torch_hooks = _TorchHooks(getattr(c, "_to_dlpack", None), getattr(c, "_cuda_getCurrentRawStream", None),
                                   getattr(c, "_cuda_exchangeDevice", None), getattr(c, "_cuda_maybeExchangeDevice", None),
                                   torch.strided, {"float32": torch.float32, "int32": torch.int32})
    return _torch_hooks


def _dl(x: Any, dtype: Optional[str] = None) -> Any:
    """A torch tensor as a DLPack capsule made by torch's C exporter (what Tensor.__dlpack__ ends in, without its
    Python steps: a few microseconds per tensor of a call); anything else as it is. The capsule holds the tensor.
    The library orders its work on the stream it is given (the caller's current one), so the stream handshake that
    __dlpack__ makes with the consumer's stream is not needed. nanobind converts a tensor of another dtype than an
    argument's but never a capsule: with `dtype` ("int32", "float32"), a tensor of another dtype is passed as it is."""
    if _is_torch(x):
        h = _hooks()
        if (h.to_dlpack is not None and x.layout == h.strided and not x.requires_grad and
                (dtype is None or x.dtype == h.dtypes[dtype])):
            return h.to_dlpack(x)
    return x


class _Where(NamedTuple):
    framework: str  # "numpy" or "torch"
    device: Any  # torch.device for torch, None for numpy
    cuda: bool


_NUMPY = _Where("numpy", None, False)


def _where(x: Any) -> _Where:
    if isinstance(x, np.ndarray):
        return _NUMPY
    if _is_torch(x):
        return _Where("torch", x.device, bool(x.is_cuda))
    return _NUMPY


def _host_array(x: Any, what: str) -> Any:
    """Something nanobind can read through DLPack or the buffer protocol, without copying."""
    if isinstance(x, np.ndarray):
        return x
    if _is_torch(x):
        return x.detach() if x.requires_grad else x  # read only: a tensor outside autograd needs no detached view
    if hasattr(x, "__dlpack__"):
        return x
    try:
        return np.asarray(x)
    except Exception as e:  # noqa: BLE001 - anything numpy cannot read
        raise InvalidArgumentError(f"{what}: cannot read {type(x).__name__} as an array ({e})") from None


def _mask_bytes(mask: Any, rows: int, what: str) -> Any:
    if mask is None:
        return None
    if _is_torch(mask):
        import torch

        m = mask.detach()
        if m.dtype not in (torch.bool, torch.uint8):
            m = m != 0
        if m.dtype == torch.bool:
            m = m.view(torch.uint8)
        m = m.reshape(-1)
        if not m.is_contiguous():
            m = m.contiguous()
        return m
    m = np.asarray(mask)
    if m.dtype != np.bool_ and m.dtype != np.uint8:
        m = m != 0
    m = np.ascontiguousarray(m.reshape(-1))
    if m.size != rows:
        raise InvalidArgumentError(f"{what} mask has {m.size} entries for {rows} token rows")
    return m.view(np.uint8)


def _offsets_from_lengths(lengths: Any) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1:
        raise InvalidArgumentError("lengths must be one-dimensional")
    if lengths.size and lengths.min() < 0:
        raise InvalidArgumentError("lengths must be non-negative")
    out = np.zeros(lengths.size + 1, dtype=np.uint64)
    np.cumsum(lengths, out=out[1:])
    return out


def _as_offsets(offsets: Any) -> np.ndarray:
    if _is_torch(offsets):
        offsets = offsets.detach().cpu().numpy()
    o = np.asarray(offsets)
    if o.ndim != 1:
        raise InvalidArgumentError("offsets must be one-dimensional")
    if o.dtype.kind not in "iu":
        raise InvalidArgumentError(f"offsets must be integers (got {o.dtype})")
    if o.dtype.kind == "i" and o.size and o.min() < 0:
        raise InvalidArgumentError("offsets must be non-negative")
    return np.ascontiguousarray(o, dtype=np.uint64)


def _concat(parts: Sequence[Any], what: str) -> tuple[Any, np.ndarray, _Where]:
    if len(parts) == 0:
        raise InvalidArgumentError(f"{what}: an empty list has no token dimension; pass a [0, dim] array with offsets [0]")
    where = _where(parts[0])
    lengths = []
    for i, p in enumerate(parts):
        if getattr(p, "ndim", None) != 2:
            raise InvalidArgumentError(f"{what}[{i}] must be a 2-D [tokens, dim] array (got {getattr(p, 'ndim', type(p).__name__)} dimensions)")
        lengths.append(p.shape[0])
    data: Any
    if where.framework == "torch":
        import torch

        for i, p in enumerate(parts):
            if _is_torch(p) and p.device != where.device:
                raise InvalidArgumentError(f"{what}[{i}] lives on {p.device} but {what}[0] on {where.device}; move them to one device")
        data = torch.cat([p.detach() for p in parts], dim=0)
    else:
        data = np.concatenate([np.asarray(p) for p in parts], axis=0)
    return data, _offsets_from_lengths(lengths), where


class Sets:
    """Ragged token sets in the caller's memory, described without copying: a [rows, dim] array and either
    ``offsets`` (n + 1 row offsets, like cu_seqlens) or ``lengths`` (n lengths); or an [n, L, dim] array with an
    optional [n, L] ``mask`` (0 = padding token). A [rows, dim] array alone is one set."""

    __slots__ = ("_dense", "where", "uniform_length", "_keep")

    def __init__(self, tokens: Any, offsets: Any = None, lengths: Any = None, mask: Any = None, *,
                 _what: str = "tokens", _raw_dtype: int = 0):
        if isinstance(tokens, (list, tuple)):
            if offsets is not None or lengths is not None:
                raise InvalidArgumentError(f"{_what}: a list of per-set arrays carries its own lengths; do not pass offsets or lengths")
            if mask is None and _raw_dtype == 0:
                # Read in place: one pointer per set (maxsim_dense_sets.set_data), no copy; None when the list
                # needs one (mixed dtypes, unlike row strides, CUDA tensors), which concatenates it below.
                dense = _core.DenseSets.from_list(tokens, _what)
                if dense is not None:
                    self.uniform_length = None
                    self.where = _where(tokens[0])
                    self._keep: tuple[Any, Any, Any] = (tokens, None, None)  # the list (dense holds its arrays too)
                    self._dense = dense
                    return
            tokens, offsets, where = _concat(tokens, _what)
        else:
            where = _where(tokens)
        if offsets is not None and lengths is not None:
            raise InvalidArgumentError("pass offsets or lengths, not both")
        data = _host_array(tokens, _what)
        ndim = getattr(data, "ndim", None)
        if ndim not in (2, 3):
            raise InvalidArgumentError(f"{_what} must have 2 ([rows, dim]) or 3 ([sets, length, dim]) dimensions, got {ndim}")
        if lengths is not None:
            offsets = _offsets_from_lengths(lengths)
        elif offsets is not None:
            offsets = _as_offsets(offsets)
        rows = data.shape[0] * (data.shape[1] if ndim == 3 else 1)
        m = _mask_bytes(mask, rows, _what)
        self.uniform_length = data.shape[1] if ndim == 3 else (data.shape[0] if offsets is None else None)
        self.where = where
        self._keep = (data, offsets, m)
        self._dense = _core.DenseSets(_dl(data), offsets, 0, m, _raw_dtype)

    @property
    def n_sets(self) -> int:
        return self._dense.n_sets

    @property
    def dim(self) -> int:
        return self._dense.dim

    def __len__(self) -> int:
        return self._dense.n_sets


# ---------------------------------------------------------------------------------------------------------------
# Progress: the library reports long calls to a callback on the calling thread (maxsim_set_progress); the
# binding always installs one, so Ctrl-C cancels a long call, and advances a tqdm bar when asked.
# ---------------------------------------------------------------------------------------------------------------
class _Progress:
    __slots__ = ("bar", "own", "total")

    def __init__(self, progress: Any, total: int, desc: str, unit: str):
        self.total = int(total)
        self.own = progress is True
        if progress is None or progress is False:
            self.bar = None
        elif progress is True:
            try:
                from tqdm.auto import tqdm  # type: ignore[import-untyped, unused-ignore]  # stubs: types-tqdm
            except ImportError:
                raise InvalidArgumentError("progress=True needs tqdm (pip install tqdm)") from None
            self.bar = tqdm(total=self.total, desc=desc, unit=unit, unit_scale=True)
        elif hasattr(progress, "update"):
            self.bar = progress
        else:
            raise InvalidArgumentError("progress must be True, False or an object with an update(n) method (a tqdm bar)")

    def __enter__(self) -> Any:
        return self.bar

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if self.bar is None or not self.own:
            return
        if exc_type is None:
            self.bar.update(max(0, self.total - self.bar.n))
        self.bar.close()


# ---------------------------------------------------------------------------------------------------------------
# Packed corpora
# ---------------------------------------------------------------------------------------------------------------
class PackedCorpus:
    """A validated, read-only packed collection of token sets (libmaxsim's packed format): owned (from
    :func:`pack`), memory-mapped from a file (:meth:`load`), or wrapping a caller's buffer (:meth:`from_buffer`).
    Usable as the documents (or queries) of every scoring call; ``close()`` releases it early."""

    __slots__ = ("_packed", "_path", "_n", "_ids_kind")

    def __init__(self, packed: _core.Packed, path: Optional[str] = None):
        self._packed = packed
        self._path = path
        # Immutable facts, kept for the per-call path (topk reads them without calling into the library).
        self._n = packed.n_sets
        self._ids_kind = "numeric" if packed.has_ids else ("string" if packed.has_string_ids else None)

    @classmethod
    def load(cls, path: Union[str, os.PathLike], validate: str = "standard") -> "PackedCorpus":
        """Memory-maps a packed file read-only (zero copy) after validating it (fast | standard | deep)."""
        p = os.fspath(path)
        return cls(_core.Packed.load(p, validate), p)

    @classmethod
    def from_buffer(cls, buffer: Any, validate: str = "standard") -> "PackedCorpus":
        """Wraps a bytes-like packed buffer (kept alive by the corpus). The format needs 64-byte alignment: an
        aligned buffer (a numpy array, mmap, or ``corpus.buffer()``) is used in place, any other is copied once
        into an aligned one."""
        view = np.frombuffer(buffer, dtype=np.uint8)
        if view.ctypes.data % 64:
            aligned = np.empty(view.size + 64, dtype=np.uint8)
            start = (-aligned.ctypes.data) % 64
            aligned = aligned[start:start + view.size]
            aligned[:] = view
            view = aligned
        return cls(_core.Packed.open(view, validate, view))

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the packed buffer (temporary file renamed into place)."""
        self._packed.save(os.fspath(path))

    def validate(self, level: str = "standard") -> None:
        """Re-validates the buffer (fast | standard | deep); raises CorruptBufferError on failure."""
        self._packed.validate(level)

    def close(self) -> None:
        self._packed.close()

    @property
    def closed(self) -> bool:
        return self._packed.closed

    def __enter__(self) -> "PackedCorpus":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return self._packed.n_sets

    @property
    def n_tokens(self) -> int:
        return self._packed.n_vectors

    @property
    def dim(self) -> int:
        return self._packed.dim

    @property
    def dtype(self) -> str:
        return _DTYPE_NAMES[self._packed.dtype]

    @property
    def nbytes(self) -> int:
        return self._packed.nbytes

    @property
    def path(self) -> Optional[str]:
        return self._path

    @property
    def offsets(self) -> np.ndarray:
        """n + 1 token offsets (a read-only view into the buffer)."""
        return self._packed.offsets()

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self._packed.offsets()).astype(np.int64)

    @property
    def ids(self) -> Optional[np.ndarray]:
        """The external uint64 ids stored with the corpus (read-only view), or None."""
        return cast(Optional[np.ndarray], self._packed.ids())

    @property
    def string_ids(self) -> Optional[list]:
        """The string ids stored with the corpus (a list of str), or None."""
        return cast(Optional[list], self._packed.string_ids(None))

    def buffer(self) -> np.ndarray:
        """The packed bytes as a read-only uint8 array (no copy)."""
        return self._packed.buffer()

    def __repr__(self) -> str:
        if self.closed:
            return "PackedCorpus(closed)"
        return f"PackedCorpus(n={len(self)}, tokens={self.n_tokens}, dim={self.dim}, dtype={self.dtype}, nbytes={self.nbytes})"


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (NaN stays NaN; the packer rejects it anyway)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


def _convert(tokens: Any, dtype: Optional[str]) -> tuple[Any, int]:
    """Converts the token storage type for pack(dtype=...): (array, raw dtype code). Torch tensors convert in
    torch; numpy arrays in numpy, bf16 as a uint16 array of bit patterns (numpy has no bfloat16) marked with
    raw code 3 (MAXSIM_BF16)."""
    if dtype is None:
        return tokens, 0
    if dtype not in ("f32", "f16", "bf16"):
        raise InvalidArgumentError(f"dtype {dtype!r} is not 'f32', 'f16' or 'bf16'")
    if _is_torch(tokens):
        import torch

        target = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        return tokens.detach().to(target), 0
    a = np.asarray(tokens)
    if dtype == "f32":
        return a.astype(np.float32, copy=False), 0
    if dtype == "f16":
        return a.astype(np.float16, copy=False), 0
    return _bf16_bits(a.astype(np.float32, copy=False)), 3


def pack(
    tokens: Any,
    offsets: Any = None,
    lengths: Any = None,
    mask: Any = None,
    ids: Any = None,
    dtype: Optional[str] = None,
    *,
    threads: int = 0,
    backend: Optional[str] = None,
    isa: Optional[str] = None,
    devices: Optional[str] = None,
    progress: Any = False,
) -> PackedCorpus:
    """Packs token sets into a :class:`PackedCorpus` (masked rows are dropped).

    tokens: a [rows, dim] array with ``offsets`` or ``lengths``; an [n, L, dim] array with an optional [n, L]
    ``mask``; or a list of per-set [tokens, dim] arrays (PyLate's ``documents_embeddings``). numpy or torch
    (CPU), float32 / float16 / bfloat16. ``ids``: n external ids stored in the corpus and returned by
    :func:`topk`: integers (uint64) or strings (non-empty UTF-8 without tab or line breaks; packed format 1.1). ``dtype``: the stored originals' type ("f32", "f16", "bf16"; default: the input's).
    ``progress``: True for a tqdm bar over the token rows (or a tqdm-like object to advance)."""
    if isinstance(tokens, (list, tuple)) and dtype is None:
        sets = Sets(tokens, offsets=offsets, lengths=lengths, mask=mask)  # read in place where the list allows
    else:
        if isinstance(tokens, (list, tuple)):
            if offsets is not None or lengths is not None:
                raise InvalidArgumentError("a list of per-set arrays carries its own lengths; do not pass offsets or lengths")
            tokens, offsets, _ = _concat(tokens, "tokens")
        tokens, raw = _convert(tokens, dtype)
        sets = Sets(tokens, offsets=offsets, lengths=lengths, mask=mask, _raw_dtype=raw)
    if sets.where.cuda:
        raise InvalidArgumentError("pack reads host memory; move the tokens to the CPU first (tokens.cpu())")
    id_array = None
    string_ids = None
    if ids is not None and len(ids) and isinstance(next(iter(ids)), str):
        string_ids = [str(x) for x in ids]
        ids = None
    if ids is not None:
        if _is_torch(ids):
            ids = ids.detach().cpu().numpy()
        ida = np.asarray(ids)
        if ida.ndim != 1 or ida.dtype.kind not in "iu":
            raise InvalidArgumentError("ids must be a one-dimensional integer array (uint64 external ids)")
        if ida.dtype.kind == "i" and ida.size and ida.min() < 0:
            raise InvalidArgumentError("ids must be non-negative (they are stored as uint64)")
        id_array = np.ascontiguousarray(ida, dtype=np.uint64)
    ctx = context(threads, backend, isa, devices)
    with _Progress(progress, sets._dense.rows, "pack", "rows") as bar:
        packed = _core.Packed.pack(ctx, sets._dense, id_array, string_ids, bar)
    return PackedCorpus(packed)


def load(path: Union[str, os.PathLike], validate: str = "standard") -> PackedCorpus:
    """Memory-maps a packed corpus file (see :meth:`PackedCorpus.load`)."""
    return PackedCorpus.load(path, validate)


# ---------------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------------
class _Side(NamedTuple):
    obj: Any  # _core.Packed or _core.DenseSets
    where: Optional[_Where]  # None for a packed corpus
    single: bool  # a 2-D array: one set, squeezed from the output
    length: Optional[int]  # uniform set length (argmax reshape), None if ragged
    keep: Any


def _side(x: Any, mask: Any, what: str) -> _Side:
    if type(x) is np.ndarray and mask is None and (x.ndim == 2 or x.ndim == 3):  # the common case, kept short
        return _Side(_core.DenseSets(x, None, 0, None, 0), _NUMPY, x.ndim == 2, x.shape[x.ndim - 2], x)
    if isinstance(x, PackedCorpus):
        if mask is not None:
            raise InvalidArgumentError(f"a {what} mask does not apply to a packed corpus (masked rows were dropped at pack time)")
        return _Side(x._packed, None, False, None, x)
    if isinstance(x, Sets):
        if mask is not None:
            raise InvalidArgumentError(f"give the {what} mask to maxsim.Sets(...)")
        return _Side(x._dense, x.where, False, x.uniform_length, x)
    s = Sets(x, mask=mask, _what=what)
    single = getattr(x, "ndim", None) == 2
    return _Side(s._dense, s.where, single, s.uniform_length, s)


def _out_where(q: _Side, d: _Side) -> _Where:
    for s in (q, d):
        if s.where is not None and s.where.cuda:
            return s.where
    for s in (q, d):
        if s.where is not None and s.where.framework == "torch":
            return s.where
    return _NUMPY


def _empty(where: _Where, shape: tuple, dtype: str) -> Any:
    if where.framework == "torch":
        return sys.modules["torch"].empty(shape, dtype=_hooks().dtypes[dtype], device=where.device)
    return np.empty(shape, dtype=dtype)


def _stream(where: _Where) -> int:
    if not where.cuda:
        return 0
    # torch's current stream on the tensors' device as a raw cudaStream_t: the accessor Triton uses, a fraction of
    # the microseconds torch.cuda.current_stream() takes to build a Stream object; that one where it is missing.
    raw = _hooks().raw_stream
    if raw is not None and where.device.index is not None:
        return int(raw(where.device.index))
    return int(sys.modules["torch"].cuda.current_stream(where.device).cuda_stream)


def _cuda_devices(tensor_devices: Sequence[Any], devices: Optional[str]) -> Optional[str]:
    """The ``devices`` option for a call whose dense inputs are CUDA tensors on ``tensor_devices`` (torch.device
    values, named by role in the messages). The library runs dense device tensors on the first device of the
    context's list and reads them there; a tensor on another GPU would be read through the wrong device. So the
    tensors must share one GPU, and the call runs on it: devices=None (the backend's default, MAXSIM_CUDA_DEVICE
    or MAXSIM_CUDA_DEVICES) becomes that GPU's ordinal, and an explicit list must start with it."""
    first = tensor_devices[0]
    ordinal = first.index
    for other in tensor_devices[1:]:
        if other != first:
            raise InvalidArgumentError(f"CUDA tensors of one call live on {first} and on {other}; move them to one GPU")
    if ordinal is None:  # a tensor always knows its ordinal; torch.device("cuda") alone does not
        raise InvalidArgumentError(f"CUDA device {first} has no ordinal")
    if not devices:
        return str(ordinal)
    head = devices.split(",", 1)[0].strip()
    if head.isdigit() and int(head) != ordinal:
        raise InvalidArgumentError(f"the tensors live on {first} but devices={devices!r} runs dense CUDA tensors on "
                                   f"device {int(head)}; pass devices='{ordinal}' (or leave it unset) or move the tensors")
    return devices


def _route(q: _Side, d: _Side, devices: Optional[str]) -> Optional[str]:
    """``devices`` for a call on these sides (see _cuda_devices); unchanged when neither is a CUDA tensor."""
    on_cuda = [s.where.device for s in (q, d) if s.where is not None and s.where.cuda]
    return _cuda_devices(on_cuda, devices) if on_cuda else devices


def _on_device(where: _Where) -> Any:
    """For a call on CUDA tensors, makes their GPU the current device and restores the caller's afterwards (the
    plugin selects its device on the calling thread, which would otherwise change torch's current device)."""
    if not where.cuda:
        return contextlib.nullcontext()
    h = _hooks()
    if h.exchange_device is None or h.maybe_exchange_device is None or where.device.index is None:
        return sys.modules["torch"].cuda.device(where.device)
    return _DeviceGuard(where.device.index, h.exchange_device, h.maybe_exchange_device)


class _DeviceGuard:
    """torch.cuda.device(index) as the two C calls it makes (torch._C._cuda_exchangeDevice on entry,
    _cuda_maybeExchangeDevice on exit), without its Python steps (a few microseconds per call). The exit call puts
    the caller's device back only where it already has a CUDA context, as torch.cuda.device does, so a process that
    uses cuda:1 alone gets no context on GPU 0."""

    __slots__ = ("index", "exchange", "maybe_exchange", "prev")

    def __init__(self, index: int, exchange: Any, maybe_exchange: Any):
        self.index, self.exchange, self.maybe_exchange = index, exchange, maybe_exchange

    def __enter__(self) -> None:
        self.prev = self.exchange(self.index)

    def __exit__(self, *exc: Any) -> None:
        self.maybe_exchange(self.prev)


def _host_for_packed(q: _Side, d: _Side) -> tuple[_Side, _Side, Any]:
    """The library scores a packed corpus (host memory) against host sets only. A CUDA tensor on the other side
    is copied to the host (its tokens only; the CUDA backend uploads the corpus once per context and caches it);
    returns the sides and the device the outputs go back to (None when nothing was copied)."""
    for this, other in ((q, d), (d, q)):
        if this.where is not None and this.where.cuda and isinstance(other.obj, _core.Packed):
            host = _host_copy(this.keep)
            moved = this._replace(obj=host._dense, where=host.where, keep=host)
            return (moved, d, this.where.device) if this is q else (q, moved, this.where.device)
    return q, d, None


def _to(x: Any, device: Any) -> Any:
    return x if x is None or device is None else x.to(device)


def scores(
    Q: Any,
    D: Any,
    *,
    metric: str = "dot",
    mode: str = "exact",
    q_mask: Any = None,
    d_mask: Any = None,
    return_argmax: bool = False,
    return_stats: bool = False,
    threads: int = 0,
    backend: Optional[str] = None,
    isa: Optional[str] = None,
    devices: Optional[str] = None,
    progress: Any = False,
    stream_ordered: bool = False,
) -> Any:
    """Every query set against every document set: a [Nq, Nd] float32 matrix in the caller's framework and
    device (numpy for numpy, torch for torch). Q, D: [n, L, d] arrays (+ masks), 2-D [L, d] arrays (one set;
    its axis is dropped from the output), lists of per-set arrays, :class:`Sets` or a :class:`PackedCorpus`.

    return_argmax: also the int32 argmax, [Nq, Nd, Lq] for uniform queries (flat in the C layout otherwise):
    the winning document-token index, -1 for masked query tokens and empty documents.

    stream_ordered: for CUDA tensors only: return once the work is enqueued on the current stream, without
    waiting for it; a bad value (NaN, infinity) in the inputs then shows as NaN scores / -1 argmax and is raised by
    :func:`synchronize` or the next call (see docs/python.md)."""
    q, d, back = _host_for_packed(_side(Q, q_mask, "queries"), _side(D, d_mask, "documents"))
    where = _out_where(q, d)
    devices = _route(q, d, devices)
    nq, nd = q.obj.n_sets, d.obj.n_sets
    out = _empty(where, (nq, nd), "float32")
    arg = None
    if return_argmax:
        rows = q.obj.token_rows if isinstance(q.obj, _core.DenseSets) else q.obj.n_vectors
        arg = _empty(where, (nq, nd, q.length) if q.length is not None else (rows * nd,), "int32")
    with _Progress(progress, nq * nd, "scores", "pairs") as bar, _on_device(where):
        ctx = context(threads, backend, isa, devices)  # creating one selects its device: inside the guard
        stats = _core.score_matrix(ctx, q.obj, d.obj, _enum(_METRICS, metric, "metric"), _enum(_MODES, mode, "mode"),
                                   _dl(out), _dl(arg), return_stats, _stream(where), bar, _flags(stream_ordered))
    out, arg = _to(out, back), _to(arg, back)
    if q.single or d.single:
        idx = tuple(0 if single else slice(None) for single in (q.single, d.single))
        out = out[idx]
        if arg is not None and q.length is not None:
            arg = arg[idx]
    result: tuple[Any, ...] = (out,)
    if return_argmax:
        result += (arg,)
    if return_stats:
        result += (stats,)
    return result if len(result) > 1 else out


def pairs(
    Q: Any,
    D: Any,
    *,
    metric: str = "dot",
    mode: str = "exact",
    q_mask: Any = None,
    d_mask: Any = None,
    return_argmax: bool = False,
    threads: int = 0,
    backend: Optional[str] = None,
    isa: Optional[str] = None,
    devices: Optional[str] = None,
    stream_ordered: bool = False,
) -> Any:
    """Query set i against document set i: [B] float32 (argmax [B, Lq] with return_argmax). stream_ordered: as
    for :func:`scores`."""
    q, d, back = _host_for_packed(_side(Q, q_mask, "queries"), _side(D, d_mask, "documents"))
    where = _out_where(q, d)
    devices = _route(q, d, devices)
    n = q.obj.n_sets
    out = _empty(where, (n,), "float32")
    arg = None
    if return_argmax:
        rows = q.obj.token_rows if isinstance(q.obj, _core.DenseSets) else q.obj.n_vectors
        arg = _empty(where, (n, q.length) if q.length is not None else (rows,), "int32")
    with _on_device(where):
        ctx = context(threads, backend, isa, devices)
        _core.score_pairs(ctx, q.obj, d.obj, _enum(_METRICS, metric, "metric"), _enum(_MODES, mode, "mode"), out, arg,
                          False, _stream(where), None, _flags(stream_ordered))
    out, arg = _to(out, back), _to(arg, back)
    return (out, arg) if return_argmax else out


def candidates(
    Q: Any,
    D: Any,
    candidates: Any = None,
    *,
    metric: str = "dot",
    mode: str = "exact",
    q_mask: Any = None,
    d_mask: Any = None,
    return_argmax: bool = False,
    threads: int = 0,
    backend: Optional[str] = None,
    isa: Optional[str] = None,
    devices: Optional[str] = None,
    progress: Any = False,
    stream_ordered: bool = False,
) -> Any:
    """Per-query candidate scoring (reranking, knowledge distillation).

    KD layout: ``D`` is [Nq, K, Ld, d] (``d_mask`` [Nq, K, Ld]) and ``candidates`` is None: returns [Nq, K].
    Candidate ids: ``D`` is any document collection and ``candidates`` an [Nq, K] integer array (returns
    [Nq, K]) or a list of per-query index lists (returns a flat array, query after query). stream_ordered: as for
    :func:`scores`."""
    q = _side(Q, q_mask, "queries")
    nq = q.obj.n_sets
    if candidates is None:
        shape = getattr(D, "shape", None)
        if shape is None or len(shape) != 4:
            raise InvalidArgumentError("candidates=None needs D in the KD layout [Nq, K, Ld, d]")
        if shape[0] != nq:
            raise InvalidArgumentError(f"D has {shape[0]} candidate lists for {nq} query sets")
        k = shape[1]
        Dflat = D.reshape(shape[0] * k, shape[2], shape[3])
        dm = None if d_mask is None else d_mask.reshape(shape[0] * k, shape[2])
        d = _side(Dflat, dm, "documents")
        cand = np.arange(nq * k, dtype=np.uint64)
        cand_offsets = np.arange(0, nq * k + 1, k, dtype=np.uint64) if k else np.zeros(nq + 1, dtype=np.uint64)
        out_shape: tuple = (nq, k)
    else:
        d = _side(D, d_mask, "documents")
        if isinstance(candidates, (list, tuple)):
            lists = [np.asarray(c, dtype=np.int64).reshape(-1) for c in candidates]
            if len(lists) != nq:
                raise InvalidArgumentError(f"{len(lists)} candidate lists for {nq} query sets")
            cand_offsets = _offsets_from_lengths([len(c) for c in lists])
            flat = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
            out_shape = (int(cand_offsets[-1]),)
        else:
            if _is_torch(candidates):
                candidates = candidates.detach().cpu().numpy()
            c = np.asarray(candidates)
            if c.ndim != 2 or c.shape[0] != nq:
                raise InvalidArgumentError(f"candidates must be [Nq={nq}, K] indices (got shape {c.shape})")
            flat = c.reshape(-1)
            cand_offsets = np.arange(0, c.size + 1, max(c.shape[1], 1), dtype=np.uint64) if c.shape[1] else np.zeros(nq + 1, dtype=np.uint64)
            out_shape = c.shape
        if flat.dtype.kind not in "iu":
            raise InvalidArgumentError(f"candidates must be integer indices (got {flat.dtype})")
        if flat.dtype.kind == "i" and flat.size and flat.min() < 0:
            raise InvalidArgumentError("candidate indices must be non-negative")
        cand = np.ascontiguousarray(flat, dtype=np.uint64)
    q, d, back = _host_for_packed(q, d)
    where = _out_where(q, d)
    devices = _route(q, d, devices)
    total = int(cand_offsets[-1])
    out = _empty(where, out_shape, "float32")
    arg = None
    if return_argmax:
        if q.length is not None:
            arg = _empty(where, out_shape + (q.length,), "int32")
            argmax_size = total * q.length
        else:
            lens = _query_lengths(q)  # ragged queries: the C layout, flat
            argmax_size = int(np.dot(np.diff(cand_offsets).astype(np.int64), lens.astype(np.int64)))
            arg = _empty(where, (argmax_size,), "int32")
    else:
        argmax_size = 0
    with _Progress(progress, total, "candidates", "pairs") as bar, _on_device(where):
        ctx = context(threads, backend, isa, devices)
        _core.score_candidates(ctx, q.obj, d.obj, cand_offsets, cand, _enum(_METRICS, metric, "metric"),
                               _enum(_MODES, mode, "mode"), out, arg, argmax_size, False, _stream(where), bar,
                               _flags(stream_ordered))
    out, arg = _to(out, back), _to(arg, back)
    return (out, arg) if return_argmax else out


def _query_lengths(q: _Side) -> np.ndarray:
    if isinstance(q.keep, PackedCorpus):
        return np.diff(q.keep.offsets)
    data, offsets, _ = q.keep._keep
    if isinstance(data, (list, tuple)):  # a list read in place
        return np.array([len(x) for x in data], dtype=np.int64)
    if offsets is None:
        return np.full(q.obj.n_sets, q.length)
    return np.diff(offsets)


class TopK(NamedTuple):
    """topk() result: scores [Nq, k] float32 (descending), indices [Nq, k] int64 (-1 past the corpus end),
    ids: the corpus' external ids, [Nq, k] uint64 for integer ids, a list of Nq lists of k str for string ids
    (None past the corpus end), None when it has none."""

    scores: Any
    indices: Any
    ids: Any


def topk(
    Q: Any,
    corpus: Any,
    k: int,
    *,
    metric: str = "dot",
    mode: str = "exact",
    q_mask: Any = None,
    return_stats: bool = False,
    threads: int = 0,
    backend: Optional[str] = None,
    isa: Optional[str] = None,
    devices: Optional[str] = None,
    progress: Any = False,
) -> Any:
    """The k best documents of ``corpus`` for every query set (score descending, ties by lower index), without
    materialising the score matrix. A 2-D query drops the query axis from the outputs. ``progress``: True for a
    tqdm bar over the (query, document) pairs (or a tqdm-like object to advance)."""
    if (type(Q) is np.ndarray and type(corpus) is PackedCorpus and q_mask is None and progress is False
            and not return_stats and corpus._ids_kind != "string" and metric in _METRICS and mode in _MODES):
        # The common call (numpy queries, a packed corpus), in one step in C++: the same checks and results.
        ctx = _contexts.get((threads, backend or "", isa or "", devices or "")) or context(threads, backend, isa, devices)
        return TopK(*_core.topk_numpy(ctx, Q, corpus._packed, k, _METRICS[metric], _MODES[mode],
                                      corpus._ids_kind == "numeric"))
    if int(k) < 0:
        raise InvalidArgumentError(f"k is {k}; it must be >= 0")
    k = int(k)
    q, d = _side(Q, q_mask, "queries"), _side(corpus, None, "corpus")
    if (q.where is not None and q.where.cuda) or (d.where is not None and d.where.cuda):
        return _topk_cuda(q, d, k, metric, mode, return_stats, threads, backend, isa, devices)
    nq = q.obj.n_sets
    s = np.empty((nq, k), dtype=np.float32)
    idx = np.empty((nq, k), dtype=np.uint64)
    ids_kind = corpus._ids_kind if isinstance(corpus, PackedCorpus) else None
    ids: Any = np.empty((nq, k), dtype=np.uint64) if ids_kind == "numeric" else None
    ctx = context(threads, backend, isa, devices)
    if progress is False:
        stats = _core.topk(ctx, q.obj, d.obj, k, _enum(_METRICS, metric, "metric"), _enum(_MODES, mode, "mode"), s,
                           idx, ids, return_stats, 0, None)
    else:
        with _Progress(progress, nq * d.obj.n_sets, "topk", "pairs") as bar:
            stats = _core.topk(ctx, q.obj, d.obj, k, _enum(_METRICS, metric, "metric"), _enum(_MODES, mode, "mode"),
                               s, idx, ids, return_stats, 0, bar)
    indices = idx.view(np.int64)
    if ids_kind == "string":
        names = d.obj.string_ids(idx.reshape(-1))
        ids = [names[i * k:(i + 1) * k] for i in range(nq)]
    if q.single:
        s, indices = s[0], indices[0]
        ids = None if ids is None else ids[0]
    where = _out_where(q, d)
    if where.framework == "torch":
        import torch

        if isinstance(ids, np.ndarray):
            ids = torch.from_numpy(ids.view(np.int64)).to(where.device)
        result = TopK(torch.from_numpy(s).to(where.device), torch.from_numpy(indices).to(where.device), ids)
    else:
        result = TopK(s, indices, ids)
    return (result, stats) if return_stats else result


# topk() on CUDA document tensors scores blocks of at most this many (query, document) pairs at a time, so the
# device holds one block's scores and their sort (about 24 bytes a pair: 400 MB) besides the running top-k.
_TOPK_BLOCK_PAIRS = 1 << 24


def _topk_cuda(q: _Side, d: _Side, k: int, metric: str, mode: str, return_stats: bool, threads: int,
               backend: Optional[str], isa: Optional[str], devices: Optional[str] = None) -> Any:
    """topk() with CUDA tensors. CUDA queries against a PackedCorpus go through the library's top-k as host
    copies (_host_for_packed) and the results are returned on the queries' device. CUDA queries against
    CUDA document tensors never leave the device: the library scores blocks of queries x documents there
    (_TOPK_BLOCK_PAIRS) and a stable descending sort on the device merges each block into the running top-k
    (ties to the lower document index, as the library ranks)."""
    import torch

    where = q.where if q.where is not None and q.where.cuda else d.where
    assert where is not None  # one side is a CUDA tensor
    device = where.device
    if isinstance(d.obj, _core.Packed):
        q, d, _ = _host_for_packed(q, d)
        top = topk(q.keep, d.keep, k, metric=metric, mode=mode, return_stats=return_stats, threads=threads,
                   backend=backend, isa=isa, devices=devices)
        res, stats = top if return_stats else (top, None)
        vals, idx, ids = torch.as_tensor(res.scores), torch.as_tensor(res.indices), res.ids
        if isinstance(ids, np.ndarray):
            ids = torch.from_numpy(ids.view(np.int64))
        if q.single:
            vals, idx, ids = vals[0], idx[0], None if ids is None else ids[0]
        out = TopK(vals.to(device), idx.to(device), ids.to(device) if isinstance(ids, torch.Tensor) else ids)
        return (out, stats) if return_stats else out
    nq, nd = q.obj.n_sets, d.obj.n_sets
    # Packed queries (host memory, scored against host copies of the document blocks) are not split.
    q_block = nq if isinstance(q.obj, _core.Packed) else max(1, min(nq, _TOPK_BLOCK_PAIRS))
    d_block = max(1, min(nd, _TOPK_BLOCK_PAIRS // q_block))
    vals_parts, idx_parts = [], []
    totals: dict[str, int] = {}
    for q0 in range(0, nq, q_block):
        qs = _sets_range(q, q0, min(nq, q0 + q_block))
        rows = min(nq, q0 + q_block) - q0
        best_v = torch.empty((rows, 0), device=device)
        best_i = torch.empty((rows, 0), dtype=torch.int64, device=device)
        for d0 in range(0, nd, d_block):
            block = scores(qs, _sets_range(d, d0, min(nd, d0 + d_block)), metric=metric, mode=mode,
                           return_stats=return_stats, threads=threads, backend=backend, isa=isa, devices=devices)
            if return_stats:
                block, st = block
                for key, value in st.items():
                    totals[key] = totals.get(key, 0) + value
            # The running top-k holds lower document indices than the block and comes first, so a stable sort
            # keeps ties in index order: the result is the stable sort of the whole row.
            v = torch.cat([best_v, block], dim=1)
            i = torch.cat([best_i, torch.arange(d0, d0 + block.shape[1], device=device).expand(rows, -1)], dim=1)
            v, order = torch.sort(v, dim=1, descending=True, stable=True)
            best_v, best_i = v[:, :k], torch.gather(i, 1, order[:, :k])
        vals_parts.append(best_v)
        idx_parts.append(best_i)
    vals = torch.cat(vals_parts) if vals_parts else torch.empty((0, min(k, nd)), device=device)
    idx = torch.cat(idx_parts) if idx_parts else torch.empty((0, min(k, nd)), dtype=torch.int64, device=device)
    if k > nd:  # past the corpus end: -inf and index -1, as the library pads
        vals = torch.cat([vals, torch.full((nq, k - nd), float("-inf"), device=device)], dim=1)
        idx = torch.cat([idx, torch.full((nq, k - nd), -1, dtype=torch.int64, device=device)], dim=1)
    if q.single:
        vals, idx = vals[0], idx[0]
    out = TopK(vals, idx, None)
    return (out, totals) if return_stats else out


def _sets_range(side: _Side, first: int, end: int) -> Any:
    """Sets first..end-1 of a side: all of them as they are, else a dense side's Sets in place (a view of the
    caller's tensor)."""
    sets = side.keep
    if first == 0 and end == side.obj.n_sets:
        return sets
    assert isinstance(sets, Sets)
    data, offsets, mask = sets._keep
    if isinstance(data, (list, tuple)):  # a list read in place: its slice, read in place too
        return Sets(data[first:end])
    if offsets is None:  # [n, L, dim] (+ [n * L] mask); a 2-D array is one set and is never split
        length = data.shape[1]
        return Sets(data[first:end], mask=None if mask is None else mask[first * length:end * length].reshape(end - first, length))
    r0, r1 = int(offsets[first]), int(offsets[end])
    return Sets(data[r0:r1], offsets=offsets[first:end + 1] - offsets[first],
                mask=None if mask is None else mask[r0:r1])


def _host_copy(x: Any) -> Any:
    """A host copy of CUDA query tokens as _side received them (a tensor, a list of tensors, or Sets)."""
    if isinstance(x, Sets):
        data, offsets, mask = x._keep
        if isinstance(data, (list, tuple)):
            return Sets([t.cpu() for t in data])
        host_mask = None if mask is None else mask.cpu()
        if offsets is not None:
            return Sets(data.cpu(), offsets=offsets, mask=host_mask)
        return Sets(data.cpu(), mask=None if host_mask is None else host_mask.reshape(data.shape[:-1]))
    return x.cpu()


def backward(
    Q: Any,
    D: Any,
    argmax: Any,
    grad_scores: Any,
    *,
    layout: str = "matrix",
    q_mask: Any = None,
    d_mask: Any = None,
    cand_offsets: Any = None,
    candidates: Any = None,
    need_q: bool = True,
    need_d: bool = True,
    deterministic: bool = True,
    threads: int = 0,
    backend: Optional[str] = None,
    isa: Optional[str] = None,
    devices: Optional[str] = None,
    stream_ordered: bool = False,
) -> tuple[Any, Any]:
    """The library's MaxSim backward (dot metric) from a forward's argmax: (grad_Q, grad_D), float32, shaped
    like Q and D (None where not requested). Used by maxsim.torch; exposed for framework-free training code.
    stream_ordered: as for :func:`scores` (a bad gradient or argmax entry leaves NaN gradients)."""
    q, d = _side(Q, q_mask, "queries"), _side(D, d_mask, "documents")
    if not isinstance(q.obj, _core.DenseSets) or not isinstance(d.obj, _core.DenseSets):
        raise InvalidArgumentError("backward needs dense queries and documents (not a packed corpus)")
    where = _out_where(q, d)
    if where.cuda:
        tensors = [s.where.device for s in (q, d) if s.where is not None and s.where.cuda]
        tensors += [x.device for x in (argmax, grad_scores) if _is_torch(x) and x.is_cuda]
        devices = _cuda_devices(tensors, devices)
    gq = _empty(where, tuple(Q.shape), "float32") if need_q else None
    gd = _empty(where, tuple(D.shape), "float32") if need_d else None
    co = None if cand_offsets is None else _as_offsets(cand_offsets)
    ca = None if candidates is None else _as_offsets(candidates)
    with _on_device(where):
        ctx = context(threads, backend, isa, devices)
        _core.backward(ctx, q.obj, d.obj, _enum(_LAYOUTS, layout, "layout"), co, ca,
                       _dl(_host_or_same(argmax), "int32"), _dl(_host_or_same(grad_scores), "float32"),
                       _dl(gq), _dl(gd), bool(deterministic), _stream(where), _flags(stream_ordered))
    return gq, gd


def _flags(stream_ordered: bool) -> int:
    return _core.CALL_STREAM_ORDERED if stream_ordered else 0


def synchronize() -> None:
    """Waits for every stream-ordered call (``stream_ordered=True``) made through maxsim's shared contexts and
    raises the first error one of them deferred (the exception the synchronous call would have raised, its
    message naming the call); returns at once when there is none."""
    with _contexts_lock:
        contexts = list(_contexts.values())
    first: Optional[BaseException] = None
    for ctx in contexts:
        try:
            _core.synchronize(ctx)
        except Error as e:  # every context is waited for; the first error is raised
            if first is None:
                first = e
    if first is not None:
        raise first


def _host_or_same(x: Any) -> Any:
    if _is_torch(x):
        x = x.detach()
        return x if x.is_contiguous() else x.contiguous()
    return np.ascontiguousarray(x)


# ---------------------------------------------------------------------------------------------------------------
# Information
# ---------------------------------------------------------------------------------------------------------------
def info(threads: int = 0, backend: Optional[str] = None, isa: Optional[str] = None,
         devices: Optional[str] = None) -> dict:
    """What ``maxsim info`` prints, as a dict: version, cpu, features, kernels (name, status, detail), the
    selected kernel, threads, backend, and the full report text."""
    ctx = context(threads, backend, isa, devices)
    text = ctx.report()
    out: dict = {"version": _core.version_string(), "kernel": ctx.kernel, "backend": ctx.backend,
                 "threads": ctx.threads, "cpu": None, "features": [], "kernels": [], "plugins": [], "report": text}
    section = None
    for line in text.splitlines():
        if line.startswith("CPU:"):
            out["cpu"] = line[4:].strip()
        elif line.strip().startswith("features:"):
            out["features"] = [f for f in line.split(":", 1)[1].strip().split(",") if f]
        elif line.startswith("CPU kernels"):
            section = "kernels"
        elif line.startswith("Plugins"):
            section = "plugins"
        elif line.startswith("  ") and section == "kernels":
            parts = line.split(None, 2)
            if len(parts) >= 2:
                out["kernels"].append({"name": parts[0], "status": parts[1], "detail": parts[2] if len(parts) > 2 else ""})
        elif line.startswith("  ") and section == "plugins":
            if line.strip() != "none found":
                out["plugins"].append(line.strip())
        else:
            section = None
    return out
