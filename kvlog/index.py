"""The key index's in-memory front: unflushed writes, in front of the LMDB index.

The memtable holds the latest unflushed (or flushed but not yet applied) write
of each key, so a process reads its own writes. It is bounded by
``max_unflushed_bytes`` through the flusher's backpressure; the LMDB index
behind it is the operating system's page cache, not process memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from kvlog.meta.cache import prefix_successor

__all__ = ["MemTable", "TOMBSTONE", "merge_sorted"]


class _Tombstone:
    def __repr__(self) -> str:
        return "TOMBSTONE"


#: The memtable's marker of a delete.
TOMBSTONE = _Tombstone()

Entry = tuple[int, "bytes | _Tombstone"]


class MemTable:
    """Latest unapplied write per key, tagged with the write generation that made it."""

    def __init__(self) -> None:
        self._items: dict[bytes, Entry] = {}
        self._lock = threading.Lock()

    def put(self, key: bytes, value: bytes | None, generation: int) -> None:
        with self._lock:
            self._items[key] = (generation, TOMBSTONE if value is None else value)

    def get(self, key: bytes) -> bytes | _Tombstone | None:
        """The unapplied value, :data:`TOMBSTONE`, or None when the key has no unapplied write."""
        entry = self._items.get(key)
        return None if entry is None else entry[1]

    def retire(self, keys: list[bytes], up_to_generation: int) -> None:
        """Forget writes to ``keys`` made at or before ``up_to_generation`` (they are applied now)."""
        with self._lock:
            for key in keys:
                entry = self._items.get(key)
                if entry is not None and entry[0] <= up_to_generation:
                    del self._items[key]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def items_in_range(
        self, start: bytes | None, stop: bytes | None, prefix: bytes | None
    ) -> list[tuple[bytes, bytes | _Tombstone]]:
        """A sorted snapshot of entries with ``start <= key < stop`` and ``prefix``."""
        upper = stop
        if prefix:
            successor = prefix_successor(prefix)
            if successor is not None and (upper is None or successor < upper):
                upper = successor
        with self._lock:
            chosen = [
                (k, v) for k, (_g, v) in self._items.items()
                if (start is None or k >= start) and (upper is None or k < upper)
                and (not prefix or k.startswith(prefix))
            ]
        chosen.sort(key=lambda kv: kv[0])
        return chosen

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._items)


def merge_sorted(
    indexed: Iterator[tuple[bytes, object]],
    front: list[tuple[bytes, bytes | _Tombstone]],
    *, reverse: bool,
) -> Iterator[tuple[bytes, object]]:
    """Merge the index's entries with the memtable's (which win), skipping tombstones."""
    if reverse:
        front = front[::-1]
    i = 0
    n = len(front)

    def before(a: bytes, b: bytes) -> bool:
        return a > b if reverse else a < b

    for key, entry in indexed:
        while i < n and before(front[i][0], key):
            fk, fv = front[i]
            i += 1
            if fv is not TOMBSTONE:
                yield fk, fv
        if i < n and front[i][0] == key:
            fk, fv = front[i]
            i += 1
            if fv is not TOMBSTONE:
                yield fk, fv
            continue
        yield key, entry
    while i < n:
        fk, fv = front[i]
        i += 1
        if fv is not TOMBSTONE:
            yield fk, fv
