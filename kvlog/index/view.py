"""A read view of the key index held open: one LMDB read snapshot and a copy of the memtable.

A view answers as the index did when it was taken, however long it is kept: its read
transaction pins the catalog and the index of that commit (LMDB keeps those pages while it is
open), and its memtable is a copy, so writes made later in this process are not seen either.
Values not inline are read by the caller's ``resolve`` in the view's own snapshot.

One view is used by one thread at a time (an LMDB read transaction is), and it holds its
reader slot until :meth:`IndexView.close`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain

from kvlog.index.entry import IndexEntry
from kvlog.index.many import NEVER, ResolveMany, lookup_many
from kvlog.index.memtable import MemTable, live_value
from kvlog.index.scan import Resolve, scan_pairs
from kvlog.index.snapshot import IndexReader

__all__ = ["IndexView"]


class IndexView:
    """The index as of one commit plus ``memtable`` (the unapplied writes when it was taken),
    read through ``reader``, which the view owns and closes."""

    def __init__(self, memtable: MemTable, reader: IndexReader) -> None:
        self._memtable = memtable
        self.reader = reader
        #: The commit version the view is pinned at.
        self.version = reader.version()
        #: The time the view answers at: records expired then are hidden, later expiries are not
        #: (a view is frozen in time as in content).
        self.now_ms = NEVER if reader.now_ms is None else reader.now_ms

    def get(self, key: bytes) -> bytes | IndexEntry | None:
        """``key``'s value (bytes), its entry (the value is in a data file), or None."""
        front = self._memtable.front.get(key)
        if front is not None:
            return front if type(front) is bytes else live_value(front, self.now_ms)
        entry = self.reader.index_get(key)
        if entry is None:
            return None
        return entry if entry.inline is None else entry.inline

    def get_many(self, keys: Sequence[bytes], resolve: ResolveMany) -> list[bytes | None]:
        """The values of ``keys`` in the order given (see :func:`~kvlog.index.many.lookup_many`)."""
        return lookup_many(self.reader, self._memtable.front, keys, resolve)

    def scan(self, start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool,
             resolve: Resolve) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs of the view, as :meth:`kvlog.index.KeyIndex.scan` gives them."""
        front = self._memtable.items_in_range(start, stop, prefix)
        return chain.from_iterable(
            scan_pairs(self.reader, front, start, stop, prefix, reverse, resolve, self.now_ms, close=False))

    def close(self) -> None:
        """End the view's read snapshot (idempotent)."""
        self.reader.close()
