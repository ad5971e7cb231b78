"""The store as a :class:`collections.abc.MutableMapping`: its views and the dict methods.

The views ``keys()``, ``values()`` and ``items()`` are live (they read the store when used,
never a copy made when they were created), and each iteration of one is a single
:meth:`~kvlog.Store.scan`: one snapshot, in key order (reversed: descending), never a key
listing followed by a read per key. ``len()`` counts the store's live keys; ``in`` reads the
one key asked for.

:class:`StoreMapping` writes the dict methods over the store's own ``get``, ``put``,
``delete`` and ``scan``: ``update`` validates every pair before writing any, ``clear`` writes
its deletions in batches, and equality and hashing are those of a handle (identity):
comparing two stores by content would scan both.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import ItemsView, Iterator, KeysView, Mapping, MutableMapping, ValuesView
from typing import Any, Protocol

from kvlog.config import KEY_BYTES_LIMIT
from kvlog.errors import InvalidRecordError
from kvlog.log.records import to_key, to_value

__all__ = ["ScannableMapping", "StoreItems", "StoreKeys", "StoreMapping", "StoreValues"]

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


#: Tombstones per write of :meth:`StoreMapping.clear`.
_CLEAR_BATCH = 4096


class StoreMapping(MutableMapping[bytes, bytes]):
    """The mapping methods of :class:`kvlog.Store`, over the primitives it implements."""

    @abstractmethod
    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""

    @abstractmethod
    def put(self, key: bytes | str, value: bytes | str, *, sync: bool = False,
            ttl_ms: int | None = None) -> None:
        """Set ``key`` to ``value``."""

    @abstractmethod
    def delete(self, key: bytes | str, *, sync: bool = False) -> None:
        """Delete ``key``."""

    @abstractmethod
    def scan(self, start: bytes | str | None = None, stop: bytes | str | None = None, *,
             prefix: bytes | str | None = None, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order (or reverse), over one snapshot."""

    @abstractmethod
    def _writer(self) -> object:
        """Raise unless the store is open for writing."""

    @abstractmethod
    def _record(self, key: Any, value: bytes | None) -> tuple[bytes, bytes | None]:
        """A validated record."""

    @abstractmethod
    def _write(self, records: list[tuple[bytes, bytes | None]], *, sync: bool) -> None:
        """Write validated records."""

    def __setitem__(self, key: bytes | str, value: bytes | str) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes | str) -> None:
        self._writer()  # closed -> StoreClosedError, read-only -> ReadOnlyError, even for a missing key
        to_key(key, KEY_BYTES_LIMIT)  # a bad key is InvalidRecordError, as in store[key]
        if key not in self:
            raise KeyError(key)
        self.delete(key)

    def __iter__(self) -> Iterator[bytes]:
        for key, _value in self.scan():
            yield key

    def __reversed__(self) -> Iterator[bytes]:
        """The keys in descending order, from one snapshot."""
        for key, _value in self.scan(reverse=True):
            yield key

    def __eq__(self, other: object) -> bool:
        return self is other  # a handle's identity; see the class docstring

    def __hash__(self) -> int:
        return object.__hash__(self)

    def keys(self) -> StoreKeys:
        """The keys, in key order; each iteration reads one snapshot."""
        return StoreKeys(self)

    def values(self) -> StoreValues:
        """The values, in the order of their keys; each iteration reads one snapshot."""
        return StoreValues(self)

    def items(self) -> StoreItems:
        """The ``(key, value)`` pairs, in key order; each iteration reads one snapshot."""
        return StoreItems(self)

    def update(self, other: Any = (), /, **kwargs: bytes | str) -> None:
        """Put every pair of ``other`` (a mapping, or an iterable of ``(key, value)`` pairs) and
        of ``kwargs``, later pairs winning. All are validated first: a bad one raises
        :class:`InvalidRecordError` and nothing is written. Not durable until a flush, like
        :meth:`put`."""
        self._writer()
        if isinstance(other, Mapping):
            pairs: Any = other.items()
        elif hasattr(other, "keys"):
            pairs = ((k, other[k]) for k in other.keys())
        else:
            pairs = other
        try:
            iterator = iter(pairs)
        except TypeError:
            raise InvalidRecordError(
                f"update takes a mapping or (key, value) pairs, not {type(other).__name__}") from None
        records: list[tuple[bytes, bytes | None]] = []
        for item in iterator:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise InvalidRecordError(f"update takes (key, value) pairs, not {item!r:.60}")
            records.append(self._record(item[0], to_value(item[1])))
        for key, value in kwargs.items():
            records.append(self._record(key, to_value(value)))
        if records:
            self._write(records, sync=False)

    def pop(self, key: bytes | str, default: Any = _MISSING) -> Any:
        """Delete ``key`` and return its value; ``default`` if it has none (without a default:
        ``KeyError``)."""
        self._writer()
        k = to_key(key, KEY_BYTES_LIMIT)
        value = self.get(k, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self.delete(k)
        return value

    def setdefault(self, key: bytes | str, default: bytes | str | None = None) -> bytes:
        """The value of ``key``; if it has none, put ``default`` (a value: None is refused with
        :class:`InvalidRecordError`) and return it as bytes."""
        self._writer()
        k = to_key(key, KEY_BYTES_LIMIT)
        value = self.get(k, _MISSING)
        if value is not _MISSING:
            assert isinstance(value, bytes)
            return value
        record = self._record(k, to_value(default))
        self._write([record], sync=False)
        assert record[1] is not None
        return record[1]

    def popitem(self) -> tuple[bytes, bytes]:
        """Delete the smallest key and return it with its value; ``KeyError`` when empty."""
        self._writer()
        for key, value in self.scan():
            self.delete(key)
            return key, value
        raise KeyError("popitem(): the store is empty")

    def clear(self) -> None:
        """Delete every key present, from one snapshot of the keys, writing the deletions in
        batches (not durable until a flush, like :meth:`delete`). Keys written meanwhile by
        other threads or processes may stay."""
        self._writer()
        chunk: list[tuple[bytes, bytes | None]] = []
        for key in self:
            chunk.append(self._record(key, None))
            if len(chunk) >= _CLEAR_BATCH:
                self._write(chunk, sync=False)
                chunk = []
        if chunk:
            self._write(chunk, sync=False)
