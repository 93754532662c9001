# SPDX-License-Identifier: Apache-2.0
"""What the integrations share: the kill-switch test, the wrapper that hands a call to the other library's
original where libmaxsim does not take it, and a record of patched attributes that disable() restores."""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any, Callable, Iterable

from .._errors import BackendUnavailableError, UnsupportedError


def killed(env_var: str) -> bool:
    """True when the environment variable turns the integration off (0, false, no, off)."""
    return os.environ.get(env_var, "1").strip().lower() in ("0", "false", "no", "off")


def wrap(original: Callable, impl: Callable, use_original: Callable[[dict], bool],
         drop: tuple[str, ...] = ()) -> Callable:
    """A stand-in for ``original`` that runs ``impl`` (without the keyword arguments in ``drop``), except where
    ``use_original(kwargs)`` says so or libmaxsim cannot take the call (CUDA tensors without a CUDA plugin):
    then ``original``. The original stays reachable as ``wrapper.__maxsim_original__``."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if use_original(kwargs):
            return original(*args, **kwargs)
        for key in drop:
            kwargs.pop(key, None)
        try:
            return impl(*args, **kwargs)
        except (BackendUnavailableError, UnsupportedError):
            return original(*args, **kwargs)

    wrapper.__maxsim_original__ = original  # type: ignore[attr-defined]
    return wrapper


def unwrapped(fn: Any) -> Any:
    """The other library's own function behind a wrapper (itself if it is not one)."""
    return getattr(fn, "__maxsim_original__", fn)


def _owner(module_name: str, path: str) -> tuple[Any, str, bool]:
    """The object holding ``path`` (``name`` or ``Class.name``) in the module, the attribute, and whether it sits
    on a class (whose __dict__ keeps a staticmethod as such)."""
    owner: Any = importlib.import_module(module_name)
    *outer, attr = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, attr, bool(outer)


class Patches:
    """Attributes replaced in other libraries' modules, each with the value it had first."""

    def __init__(self) -> None:
        self._originals: dict[tuple[str, str], Any] = {}

    def set(self, module_name: str, path: str, value: Any) -> None:
        """Sets ``module.path`` (``name`` or ``Class.name``) to ``value``, remembering the first original."""
        owner, attr, on_class = _owner(module_name, path)
        self._originals.setdefault((module_name, path), owner.__dict__[attr] if on_class else getattr(owner, attr))
        setattr(owner, attr, value)

    def set_where_present(self, sites: Iterable[str], name: str, value: Any) -> None:
        """Sets ``name`` in each of the modules ``sites`` that imports and has it (a module that needs an optional
        dependency of the other library is left alone)."""
        for site in sites:
            try:
                module = importlib.import_module(site)
            except ImportError:
                continue
            if hasattr(module, name):
                self.set(site, name, value)

    def restore(self) -> None:
        for (module_name, path), original in list(self._originals.items()):
            owner, attr, _ = _owner(module_name, path)
            setattr(owner, attr, original)
        self._originals.clear()

    def __bool__(self) -> bool:
        return bool(self._originals)
