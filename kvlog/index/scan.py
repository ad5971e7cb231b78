"""Scans of the whole key index: the memtable's writes over the snapshot's index (its pending
runs over its B-tree), in key order or reverse, tombstones removed.

A value comes from the memtable, inline from an index entry, or from the data file an entry
points at: the caller's ``resolve`` reads that one in the scan's own snapshot, when the scan
reaches it. A forward scan reads its sources in chunks merged whole (see
:mod:`kvlog.index.merged`), the first ones small, so a scan abandoned after a few entries reads
about that many; a reverse scan, and the rest of a forward one past a long key in the B-tree,
merge entry by entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, cast

import lmdb

from kvlog._native import load
from kvlog.index.entry import IndexEntry, RecordExpired, decode_entry
from kvlog.index.keys import DIRECT_KEY_BYTES, scan_bounds
from kvlog.index.memtable import Entry, live_value
from kvlog.index.merged import (
    CLEARED,
    END,
    ERROR,
    FIRST_CHUNK,
    MAX_CHUNK,
    OVERLAY,
    REFILL,
    RESUME,
    TREE,
    Item,
    overlay,
    overlay_chunk,
)
from kvlog.index.snapshot import IndexReader, end_reader, read_failure, scan_sources
from kvlog.meta.env import CacheDamage

if TYPE_CHECKING:
    from kvlog.index import _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")

__all__ = ["Resolve", "merge_sorted", "scan_pairs"]

#: Reads the value an entry points at (not inline), in the snapshot of the reader given:
#: ``(key, entry, reader)``.
Resolve = Callable[[bytes, IndexEntry, IndexReader], bytes]


def merge_sorted(
    indexed: Iterator[tuple[bytes, IndexEntry]],
    front: list[tuple[bytes, Entry]],
    *, reverse: bool, now_ms: int,
) -> Iterator[tuple[bytes, bytes | IndexEntry]]:
    """Merge the index's entries with the memtable's (which win), skipping tombstones and the
    memtable's writes expired at ``now_ms`` (the index's entries come filtered by their reader)."""
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
            value = live_value(fv, now_ms)
            if value is not None:
                yield fk, value
        if i < n and front[i][0] == key:
            fk, fv = front[i]
            i += 1
            value = live_value(fv, now_ms)
            if value is not None:
                yield fk, value
            continue
        yield key, entry
    while i < n:
        fk, fv = front[i]
        i += 1
        value = live_value(fv, now_ms)
        if value is not None:
            yield fk, value


def scan_pairs(
    reader: IndexReader, front: list[tuple[bytes, Entry]], lower: bytes | None,
    upper: bytes | None, prefix: bytes | None, reverse: bool, resolve: Resolve, now_ms: int, *,
    close: bool = True,
) -> Iterator[list[tuple[bytes, bytes]] | Iterator[tuple[bytes, bytes]]]:
    """The ``(key, value)`` pairs of a scan as parts to chain (lists of pairs read in bulk, or
    iterators), hiding the records expired at ``now_ms`` (the reader's own time); ``reader`` is
    closed when the parts end or are abandoned, unless ``close`` is False (a read view's reader,
    which outlives its scans). Nothing is read before the first part is asked for."""
    if not reverse:
        lo, hi = (lower, upper) if prefix is None else scan_bounds(lower, upper, prefix)
        if (lo is None or len(lo) <= DIRECT_KEY_BYTES) and (hi is None or len(hi) <= DIRECT_KEY_BYTES):
            if lo is not None and hi is not None and lo >= hi:
                if close:
                    end_reader(reader)
                return iter(())
            return _merged(reader, front, lo, hi, upper, prefix, resolve, now_ms, close)
    return _entry_by_entry(reader, front, lower, upper, prefix, reverse, resolve, now_ms, close)


def _merged(
    reader: IndexReader, front: list[tuple[bytes, Entry]], lower: bytes | None, upper: bytes | None,
    stop: bytes | None, prefix: bytes | None, resolve: Resolve, now_ms: int, close: bool,
) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    """A forward scan of ``lower <= key < upper`` (short bounds; ``stop`` and ``prefix`` as
    asked) in parts: walks of the B-tree merged with the overlay (see :mod:`kvlog.index.merged`;
    iterators of pairs in C), a value in a data file read in Python where a walk stops at one,
    and at the B-tree's first long key the rest entry by entry. One generator for the whole
    scan, a short scan's fixed cost; LMDB errors and damage are raised as kvlog errors, the
    cursor closed and the reader ended (``close``) when the parts end or are abandoned."""
    cur: lmdb.Cursor | None = None
    try:
        cur, runs, views = scan_sources(reader)
        merge = overlay(front, runs, lower, upper, now_ms)
        gate = views if runs else None
        size = FIRST_CHUNK
        found = cur.first() if lower is None else cur.set_range(lower)
        # The reader's transaction makes bytes, never buffers.
        source = cast(Iterator[tuple[bytes, bytes]], cur.iternext()) if found else None
        pairs, pairs_done = ([], True) if merge is None else overlay_chunk(merge, gate, size)
        at = 0
        held: tuple[bytes, bytes] | None = None
        resume: bytes | None = None
        while True:
            walk = _runs.ScanWalk(source, pairs, at, pairs_done, upper, resume, now_ms, held)
            yield walk
            state = walk.state
            if state == END or state == CLEARED:
                return
            if state == RESUME:
                # A long key in the B-tree: the rest entry by entry, from where the walks stopped.
                assert walk.resume is not None
                cur.close()
                ahead = [p for p in front if p[0] >= walk.resume]
                yield _values(reader, merge_sorted(reader.index_scan(walk.resume, stop, prefix, False), ahead,
                                                   reverse=False, now_ms=now_ms), resolve)
                return
            if state == ERROR:
                assert walk.error is not None
                raise walk.error
            source, at, held, upper, resume = walk.source, walk.at, walk.held, walk.upper, walk.resume
            if state == REFILL:
                assert merge is not None
                size = min(2 * size, MAX_CHUNK)
                pairs, pairs_done = overlay_chunk(merge, gate, size)
                at = 0
            elif state == TREE:
                assert held is not None
                key, entry = decode_entry(*held)  # raises for a damaged entry
                held = None
                yield _resolving(reader, [(key, (entry.partition, entry.offset, entry.expires_ms))], resolve)
            elif state == OVERLAY:
                assert walk.item is not None
                key, item = walk.item
                if type(item) is tuple:
                    yield _resolving(reader, [walk.item], resolve)
                else:  # a memtable's deletion or write with a time to live
                    value = live_value(item, now_ms)
                    if value is not None:
                        yield iter(((key, value),))
            else:
                raise AssertionError(f"a scan walk stopped in state {state}")
    except (lmdb.MapFullError, lmdb.MapResizedError):
        raise
    except (lmdb.Error, CacheDamage) as e:
        raise read_failure(reader, e) from (e if isinstance(e, lmdb.Error) else None)
    finally:
        if cur is not None:
            cur.close()  # before the reader's transaction ends
        if close:
            end_reader(reader)


def _entry_by_entry(
    reader: IndexReader, front: list[tuple[bytes, Entry]], lower: bytes | None,
    upper: bytes | None, prefix: bytes | None, reverse: bool, resolve: Resolve, now_ms: int,
    close: bool,
) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    """:func:`scan_pairs` merged entry by entry (a reverse scan, or long bounds)."""
    try:
        yield _values(reader, merge_sorted(reader.index_scan(lower, upper, prefix, reverse), front,
                                           reverse=reverse, now_ms=now_ms), resolve)
    finally:
        if close:
            end_reader(reader)


def _resolving(reader: IndexReader, chunk: Iterable[tuple[bytes, Item]],
               resolve: Resolve) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of a merged chunk, the values in data files read as they are reached."""
    for key, item in chunk:
        if type(item) is bytes:
            yield key, item
            continue
        assert isinstance(item, tuple)
        partition, offset, expires = item
        try:
            value = resolve(key, IndexEntry(partition, offset, None, expires), reader)
        except RecordExpired:
            continue  # removed by a compaction whose clock saw it expired
        yield key, value


def _values(reader: IndexReader, merged: Iterator[tuple[bytes, bytes | IndexEntry]],
            resolve: Resolve) -> Iterator[tuple[bytes, bytes]]:
    for key, found in merged:
        if not isinstance(found, IndexEntry):
            yield key, found
        elif found.inline is not None:
            yield key, found.inline
        else:
            try:
                value = resolve(key, found, reader)
            except RecordExpired:
                continue  # removed by a compaction whose clock saw it expired
            yield key, value
