# SPDX-License-Identifier: Apache-2.0
"""maxsim: exact late-interaction (MaxSim) scoring on libmaxsim, for numpy and PyTorch.

    import maxsim
    S = maxsim.scores(Q, D)                  # [Nq, Nd] for Q [Nq, Lq, d], D [Nd, Ld, d] (numpy or torch)
    corpus = maxsim.pack(doc_embeddings)     # a list of [Ld_i, d] arrays, or [n, L, d] + mask
    top = maxsim.topk(Q, corpus, k=10)       # (scores, indices, ids)

docs/python.md has the whole API. Nothing is patched at import: integrations are enabled explicitly
(maxsim.integrations.pylate.enable()).
"""

from . import _core
from ._api import (
    PackedCorpus,
    Sets,
    TopK,
    backward,
    candidates,
    context,
    info,
    load,
    pack,
    pairs,
    scores,
    synchronize,
    topk,
)
from ._errors import (
    BackendUnavailableError,
    BufferTooSmallError,
    CancelledError,
    CorruptBufferError,
    DimMismatchError,
    Error,
    FileError,
    InternalError,
    InvalidArgumentError,
    NonFiniteError,
    OutOfMemoryError,
    PluginError,
    UnsupportedError,
)
from ._errors import BY_STATUS as _BY_STATUS

_core.register_errors(Error, _BY_STATUS)

__version__: str = _core.version_string()

__all__ = [
    "BackendUnavailableError", "BufferTooSmallError", "CancelledError", "CorruptBufferError", "DimMismatchError",
    "Error", "FileError", "InternalError", "InvalidArgumentError", "NonFiniteError", "OutOfMemoryError",
    "PackedCorpus", "PluginError", "Sets", "TopK", "UnsupportedError", "__version__", "backward", "candidates",
    "context", "info", "load", "pack", "pairs", "scores", "synchronize", "topk",
]
