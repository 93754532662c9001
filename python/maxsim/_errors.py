# SPDX-License-Identifier: Apache-2.0
"""The maxsim.Error hierarchy: one class per libmaxsim status (maxsim.h), each also a subclass of the closest
built-in exception so that ``except ValueError`` and friends keep working. The message is the library's."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error libmaxsim reports. ``status`` is the C status code, ``status_name`` its name."""

    status: int = -1
    status_name: str = ""


class InvalidArgumentError(Error, ValueError):
    """MAXSIM_ERR_INVALID_ARGUMENT: a bad dtype, rank, shape, option value, or a closed corpus."""


class NonFiniteError(InvalidArgumentError):
    """MAXSIM_ERR_NON_FINITE: an input vector holds NaN/Inf or has a norm above 1e19."""


class DimMismatchError(InvalidArgumentError):
    """MAXSIM_ERR_DIM_MISMATCH: queries and documents have different token dimensions."""


class CorruptBufferError(Error, ValueError):
    """MAXSIM_ERR_INVALID_BUFFER: a packed buffer or file failed validation."""


class FileError(Error, OSError):
    """MAXSIM_ERR_IO: a file could not be opened, read, written or mapped."""


class OutOfMemoryError(Error, MemoryError):
    """MAXSIM_ERR_OUT_OF_MEMORY: a host or device allocation failed."""


class UnsupportedError(Error, NotImplementedError):
    """MAXSIM_ERR_UNSUPPORTED: a valid request this build or backend does not implement."""


class BackendUnavailableError(Error, RuntimeError):
    """MAXSIM_ERR_BACKEND_UNAVAILABLE: a named backend or ISA is not available on this machine."""


class BufferTooSmallError(Error, ValueError):
    """MAXSIM_ERR_BUFFER_TOO_SMALL: an output was too small (the binding sizes outputs itself)."""


class PluginError(Error, RuntimeError):
    """MAXSIM_ERR_PLUGIN: a plugin reported a failure (launch failure, device error)."""


class InternalError(Error, RuntimeError):
    """MAXSIM_ERR_INTERNAL: a bug in libmaxsim; please report it with the message."""


class CancelledError(Error):
    """MAXSIM_ERR_CANCELLED: a progress callback asked the call to stop."""


BY_STATUS: dict[int, type[Error]] = {
    1: InvalidArgumentError,
    2: CorruptBufferError,
    3: NonFiniteError,
    4: DimMismatchError,
    5: FileError,
    6: OutOfMemoryError,
    7: UnsupportedError,
    8: BackendUnavailableError,
    9: BufferTooSmallError,
    10: PluginError,
    11: InternalError,
    12: CancelledError,
}
