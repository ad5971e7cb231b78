"""The twin of the compiled ``_runs.StoreGet`` (exported by :mod:`kvlog.index._runs_py`): a
store's whole get in one call when the key is a valid bytes key of an open store."""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["StoreGet"]


class StoreGet:
    """Called as ``get(key, default=None)``: the common case of a store's get -- ``key`` a bytes
    object of 1 to ``key_limit`` bytes, ``owner._closed`` False -- answered as
    ``lookup(key, owner._refresh_at)`` gives: its bytes, ``default`` for None, and
    ``found(key, answer, default)`` for any other answer (stale, or a value in a data file).
    Every other call, keywords included, is ``fallback(*args, **kwargs)``'s: the Python get,
    which gives every answer and raises every error."""

    __slots__ = ("_owner", "_lookup", "_fallback", "_found", "_key_limit")

    def __init__(self, owner: Any, lookup: Any, fallback: Any, found: Any, key_limit: int, /) -> None:
        key_limit = operator.index(key_limit)
        if key_limit < 1:
            raise ValueError("StoreGet() needs a positive key_limit")
        self._owner = owner
        self._lookup = lookup
        self._fallback = fallback
        self._found = found
        self._key_limit = key_limit

    # What introspection reads of a bound method (help, inspect.signature): the
    # store's own get's name, qualified name and docstring (see _doc below), the get itself as
    # __wrapped__ (its signature is the store get's), and the store as __self__.
    @property
    def __name__(self) -> str:
        name: str = self._fallback.__name__
        return name

    def __getattr__(self, name: str) -> Any:
        if name == "__qualname__":  # a class body's __qualname__ names the class: read here
            return self._fallback.__qualname__
        raise AttributeError(f"'StoreGet' object has no attribute {name!r}")

    @property
    def __wrapped__(self) -> Any:
        return self._fallback

    @property
    def __self__(self) -> Any:
        return self._owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or not 1 <= len(args) <= 2:
            return self._fallback(*args, **kwargs)
        key = args[0]
        owner = self._owner
        if type(key) is not bytes or not 0 < len(key) <= self._key_limit or owner._closed is not False:
            return self._fallback(*args)
        answer = self._lookup(key, owner._refresh_at)
        if type(answer) is bytes:
            return answer
        default = args[1] if len(args) == 2 else None
        if answer is None:
            return default
        return self._found(key, answer, default)


def _doc(get: StoreGet) -> str | None:
    """The store get's docstring (``help(store.get)``)."""
    doc: str | None = get._fallback.__doc__
    return doc


StoreGet.__doc__ = property(_doc)  # type: ignore[assignment]
