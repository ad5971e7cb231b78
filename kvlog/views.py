"""The views of :class:`kvlog.Store` as a mapping: ``keys()``, ``values()``, ``items()``.

Each is live (it reads the store when used, never a copy made when it was created), and each
iteration of one is a single :meth:`~kvlog.Store.scan`: one snapshot, in key order (reversed:
descending), never a key listing followed by a read per key. ``len()`` counts the store's
live keys; ``in`` reads the one key asked for.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any, Protocol

from kvlog.errors import InvalidRecordError

__all__ = ["ScannableMapping", "StoreItems", "StoreKeys", "StoreValues"]

_MISSING = object()


class ScannableMapping(Protocol):
    """What the views need of the store: a mapping that scans in key order (or reverse)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[bytes]: ...

    def __contains__(self, key: object) -> bool: ...

    def __getitem__(self, key: bytes) -> bytes: ...

    def get(self, key: Any, default: Any = None) -> Any: ...

    def scan(self, start: Any = None, stop: Any = None, *, prefix: Any = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]: ...

    def __reversed__(self) -> Iterator[bytes]: ...


class StoreKeys(KeysView[bytes]):
    """The store's keys, in key order."""

    _mapping: ScannableMapping

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._mapping)

    def __reversed__(self) -> Iterator[bytes]:
        return reversed(self._mapping)

    def __contains__(self, key: object) -> bool:
        return key in self._mapping


class StoreValues(ValuesView[bytes]):
    """The store's values, in the order of their keys."""

    _mapping: ScannableMapping

    def __iter__(self) -> Iterator[bytes]:
        for _key, value in self._mapping.scan():
            yield value

    def __reversed__(self) -> Iterator[bytes]:
        for _key, value in self._mapping.scan(reverse=True):
            yield value

    def __contains__(self, value: object) -> bool:
        return any(v == value for v in self)


class StoreItems(ItemsView[bytes, bytes]):
    """The store's ``(key, value)`` pairs, in key order."""

    _mapping: ScannableMapping

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self._mapping.scan()

    def __reversed__(self) -> Iterator[tuple[bytes, bytes]]:
        return self._mapping.scan(reverse=True)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        key, value = item
        try:
            found = self._mapping.get(key, _MISSING)
        except InvalidRecordError:
            return False  # like a dict: a key that cannot be stored is simply not there
        return found is not _MISSING and bool(found == value)
