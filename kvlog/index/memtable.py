"""The key index's in-memory front: unflushed writes, in front of the LMDB index.

The memtable holds the latest unflushed (or flushed but not yet applied) write
of each key, so a process reads its own writes. It is bounded by
``max_unflushed_bytes`` through the flusher's backpressure; the LMDB index
behind it is the operating system's page cache, not process memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from kvlog.index.keys import prefix_successor

__all__ = ["Expiring", "MemTable", "TOMBSTONE", "Tombstone", "live_value"]


class Tombstone:
    """The type of :data:`TOMBSTONE`."""

    def __repr__(self) -> str:
        return "TOMBSTONE"


#: The memtable's marker of a delete.
TOMBSTONE = Tombstone()


class Expiring:
    """A memtable write with a time to live: its value, and when it expires (ms since the epoch).

    Writes without one stay plain ``bytes`` in the memtable (the put fast path never makes
    one of these)."""

    __slots__ = ("value", "expires_ms")

    def __init__(self, value: bytes, expires_ms: int) -> None:
        self.value = value
        self.expires_ms = expires_ms

    def __repr__(self) -> str:
        return f"Expiring({self.value!r}, expires_ms={self.expires_ms})"


def live_value(entry: bytes | Tombstone | Expiring, now_ms: int) -> bytes | None:
    """The value a memtable entry shows at ``now_ms``: None for a delete or an expired write."""
    if type(entry) is bytes:
        return entry
    if type(entry) is Expiring:
        return entry.value if now_ms < entry.expires_ms else None
    return None


#: A memtable entry: a value, a delete, or a value with a time to live.
Entry = bytes | Tombstone | Expiring


class MemTable:
    """Latest unapplied write per key (the value itself, or :data:`TOMBSTONE`).

    ``front`` takes new writes; ``frozen`` holds the writes of the flush in flight, until that
    flush is applied to the index. ``lock`` is shared with the flusher, which updates the
    memtable and its write buffer under it (the methods said to be called under ``lock``).
    """

    def __init__(self) -> None:
        self.front: dict[bytes, Entry] = {}
        self.frozen: dict[bytes, Entry] | None = None
        self.lock = threading.Lock()

    def put(self, key: bytes, value: bytes | None) -> None:
        with self.lock:
            self.front[key] = TOMBSTONE if value is None else value

    def get(self, key: bytes) -> Entry | None:
        """The unapplied value, :data:`TOMBSTONE`, or None when the key has no unapplied write."""
        value = self.front.get(key)
        if value is None:
            frozen = self.frozen
            if frozen is not None:
                return frozen.get(key)
        return value

    def write(self, records: Iterable[tuple[bytes, bytes | None]],
              expires: Iterable[tuple[int, int]] = ()) -> None:
        """Enter validated ``(key, value)`` writes (None: a delete), in order (call under
        ``lock``); ``expires`` lists ``(position in records, expires_ms)`` of the writes that
        have a time to live, in order."""
        front = self.front
        pending = iter(expires)
        expiring = next(pending, None)
        for i, (key, value) in enumerate(records):
            if value is None:
                front[key] = TOMBSTONE
            elif expiring is not None and expiring[0] == i:
                front[key] = Expiring(value, expiring[1])
                expiring = next(pending, None)
            else:
                front[key] = value

    def freeze(self) -> None:
        """Move ``front`` to ``frozen`` (call under ``lock``, when a flush takes the buffer)."""
        if self.frozen is not None:
            self.frozen.update(self.front)
        else:
            self.frozen = self.front  # set before front is replaced: a reader never misses both
        self.front = {}

    def retire(self) -> None:
        """Forget the frozen writes: the flush that took them is applied to the index (call
        under ``lock``)."""
        self.frozen = None

    def discard(self) -> None:
        """Forget every write, front and frozen: they were dropped unflushed (call under ``lock``)."""
        self.front = {}
        self.frozen = None

    def clear(self) -> None:
        with self.lock:
            self.front = {}
            self.frozen = None

    def __len__(self) -> int:
        frozen = self.frozen
        if not frozen:
            return len(self.front)
        return len(self.front) + sum(1 for k in frozen if k not in self.front)

    def _merged(self) -> dict[bytes, Entry]:
        frozen = self.frozen
        if not frozen:
            return self.front
        return {**frozen, **self.front}

    def items_in_range(
        self, start: bytes | None, stop: bytes | None, prefix: bytes | None
    ) -> list[tuple[bytes, Entry]]:
        """A sorted snapshot of entries with ``start <= key < stop`` and ``prefix``."""
        upper = stop
        if prefix:
            successor = prefix_successor(prefix)
            if successor is not None and (upper is None or successor < upper):
                upper = successor
        with self.lock:
            if not self.front and not self.frozen:
                return []
            items = self._merged()
            if start is None and upper is None and not prefix:
                chosen = list(items.items())
            else:
                chosen = [
                    (k, v) for k, v in items.items()
                    if (start is None or k >= start) and (upper is None or k < upper)
                    and (not prefix or k.startswith(prefix))
                ]
        chosen.sort(key=lambda kv: kv[0])
        return chosen

    def pick(self, keys: Iterable[bytes]) -> dict[bytes, Entry]:
        """The unapplied writes of ``keys`` that have one, taken together under ``lock``."""
        with self.lock:
            front, frozen = self.front, self.frozen
            picked: dict[bytes, Entry] = {}
            for key in keys:
                value = front.get(key)
                if value is None and frozen is not None:
                    value = frozen.get(key)
                if value is not None:
                    picked[key] = value
            return picked

    def copy(self) -> MemTable:
        """A memtable of its own holding every unapplied write at the time of the call (a read
        view's)."""
        out = MemTable()
        with self.lock:
            out.front = dict(self._merged())
        return out

    def keys(self) -> list[bytes]:
        with self.lock:
            return list(self._merged())
