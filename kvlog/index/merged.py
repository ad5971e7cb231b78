"""Forward scans merged a chunk at a time: the memtable's writes, the pending runs (newest first)
and the B-tree, each read in chunks and merged by whole chunks, so that no Python frame runs per
entry.

Each source gives its entries in key order, a chunk at a time, as ``(key, item)``: the value
(bytes), ``None`` for a key hidden there (a deletion, a tombstone, an entry or write expired at
the scan's time) which hides it in the older sources too, or ``(partition, offset, expiry)`` for
a value in a data file. A chunk of each source is read; the keys up to the smallest last key
among the sources not exhausted (the frontier) are known in every source, so they are merged
(the newest source winning a key), the hidden ones dropped, and handed out; then the sources
left short are read again.

Chunks start at :data:`FIRST_CHUNK` entries and double up to :data:`MAX_CHUNK`: a scan that
stops after ``n`` entries reads about ``n`` of each source (at most twice that), and a long
scan reads in chunks large enough that the per-chunk cost is spread thin.

The B-tree's long keys (see :mod:`kvlog.index.keys`) sort by their real keys only within a
group: at the first one, this path stops and returns the bound from which the caller reads the
rest entry by entry.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator
from itertools import islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import lmdb

from kvlog._native import load
from kvlog.index.entry import decode_entry
from kvlog.index.keys import DIRECT_KEY_BYTES
from kvlog.index.memtable import Entry, live_value
from kvlog.index.runs import Buffer
from kvlog.meta.env import CacheDamage

if TYPE_CHECKING:
    from kvlog.index import _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")

__all__ = ["FIRST_CHUNK", "MAX_CHUNK", "Item", "merged_chunks"]

#: Entries of each source the first chunk of a scan reads.
FIRST_CHUNK = 16
#: The largest chunk: each next chunk doubles, up to this.
MAX_CHUNK = 512

#: What a scan's entry holds: the value, None (hidden), or (partition, offset, expiry or None)
#: of a value in a data file.
Item = bytes | tuple[int, int, int | None] | None
#: A source's next chunk of at most the size asked: ``(items, in data files, exhausted, resume)``
#: where ``resume`` (not None: a long key met) is the bound the rest must be read from.
_Fill = Callable[[int], tuple[list[tuple[bytes, Any]], int, bool, bytes | None]]
_FIRST = itemgetter(0)


def _run_damage() -> CacheDamage:
    return CacheDamage("an index run is damaged", index_only=True)


def _memtable_source(front: list[tuple[bytes, Entry]], now_ms: int) -> _Fill:
    at = 0

    def fill(size: int) -> tuple[list[tuple[bytes, Any]], int, bool, bytes | None]:
        nonlocal at
        part = front[at:at + size]
        at += size
        items = [(k, v if type(v) is bytes else live_value(v, now_ms)) for k, v in part]
        return items, 0, at >= len(front), None

    return fill


def _run_source(run: Buffer, lower: bytes | None, upper: bytes | None, now_ms: int) -> _Fill:
    low = lower

    def fill(size: int) -> tuple[list[tuple[bytes, Any]], int, bool, bytes | None]:
        nonlocal low
        try:
            raw = _runs.entries(run, low, upper, size, False)
            items, to_resolve, stopped = _runs.scan_items(raw, now_ms, True)
        except ValueError:
            raise _run_damage() from None
        if stopped != len(raw):
            raise _run_damage()  # runs hold short keys only
        done = len(raw) < size
        if not done:
            low = raw[-1][0] + b"\x00"
        return items, to_resolve, done, None

    return fill


def _tree_source(cur: lmdb.Cursor, lower: bytes | None, upper: bytes | None, now_ms: int,
                 keep_hidden: bool) -> _Fill | None:
    found = cur.first() if lower is None else cur.set_range(lower)
    if not found:
        return None
    entries = cur.iternext()  # the reader's transaction makes bytes

    def fill(size: int) -> tuple[list[tuple[bytes, Any]], int, bool, bytes | None]:
        raw: list[tuple[bytes, bytes]] = list(islice(entries, size))
        done = len(raw) < size
        if upper is not None and raw and raw[-1][0] >= upper:
            raw = raw[:bisect_left(raw, upper, key=_FIRST)]
            done = True
        try:
            items, to_resolve, stopped = _runs.scan_items(raw, now_ms, keep_hidden)
        except ValueError:
            for k, v in raw:
                decode_entry(k, v)  # raises for the damaged entry
            raise
        if stopped != len(raw):
            # A long key's group: every real key of it is > its first bytes + b"\0".
            return items, to_resolve, True, raw[stopped][0][:DIRECT_KEY_BYTES] + b"\x00"
        return items, to_resolve, done, None

    return fill


def _clip(items: list[tuple[bytes, Any]], bound: bytes) -> tuple[list[tuple[bytes, Any]], bool]:
    """``items`` below ``bound``, and whether any were cut."""
    if items and items[-1][0] >= bound:
        return items[:bisect_left(items, bound, key=_FIRST)], True
    return items, False


def merged_chunks(
    cur: lmdb.Cursor, runs: list[Buffer], front: list[tuple[bytes, Entry]],
    lower: bytes | None, upper: bytes | None, now_ms: int,
) -> Generator[tuple[list[tuple[bytes, Any]], bool], None, bytes | None]:
    """Forward scan of ``lower <= key < upper`` (each at most ``DIRECT_KEY_BYTES`` long) over
    the memtable's writes ``front`` (sorted, within the range), the pending ``runs`` (newest
    first) and the B-tree (``cur``), at ``now_ms``: yields lists of ``(key, item)`` without the
    hidden keys, with whether any item may be a data file's position (:data:`Item`). Returns
    None at the end of the range, or the lower bound from which the rest must be read entry by
    entry (the B-tree's first long key)."""
    fills: list[_Fill] = []
    if front:
        fills.append(_memtable_source(front, now_ms))
    fills.extend(_run_source(run, lower, upper, now_ms) for run in runs)
    tree = _tree_source(cur, lower, upper, now_ms, keep_hidden=bool(fills))
    if tree is not None:
        fills.append(tree)
    count = len(fills)
    if not count:
        return None
    size = FIRST_CHUNK
    if tree is not None and count == 1:  # the B-tree alone: its chunks as they come
        resolving = False
        while True:
            items, to_resolve, exhausted, stop = tree(size)
            resolving = resolving or to_resolve > 0
            if items:
                yield items, resolving
            if exhausted:
                return stop
            if size < MAX_CHUNK:
                size *= 2
    bufs: list[list[tuple[bytes, Any]]] = [[] for _ in fills]
    done = [False] * count
    resume: bytes | None = None
    resolving = False
    while True:
        for i in range(count):
            while not bufs[i] and not done[i]:
                items, to_resolve, exhausted, stop = fills[i](size)
                resolving = resolving or to_resolve > 0
                done[i] = exhausted
                if stop is not None:
                    resume = stop
                    for j in range(count):
                        bufs[j], cut = _clip(bufs[j], stop)
                        done[j] = done[j] or cut
                elif resume is not None:
                    items, cut = _clip(items, resume)
                    done[i] = done[i] or cut
                bufs[i] = items
        frontier: bytes | None = None
        for i in range(count):
            if not done[i]:
                last = bufs[i][-1][0]
                if frontier is None or last < frontier:
                    frontier = last
        parts: list[list[tuple[bytes, Any]]] = []
        for i in range(count):
            buf = bufs[i]
            if not buf:
                continue
            if frontier is None or buf[-1][0] <= frontier:
                parts.append(buf)
                bufs[i] = []
            else:
                cut = bisect_right(buf, frontier, key=_FIRST)
                if cut:
                    parts.append(buf[:cut])
                    bufs[i] = buf[cut:]
        if not parts:
            return resume  # every source exhausted
        if len(parts) == 1:
            merged = parts[0]
        else:
            newest: dict[bytes, Any] = {}
            for part in reversed(parts):  # the newer sources last: their entries win
                newest.update(part)
            merged = sorted(newest.items())
        merged = [p for p in merged if p[1] is not None]
        if merged:
            yield merged, resolving
        if size < MAX_CHUNK:
            size *= 2
