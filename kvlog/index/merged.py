"""Forward scans over the memtable's writes, the pending runs (newest first) and the B-tree,
merged with no Python frame per entry.

The B-tree is walked by ``ScanWalk`` (in ``_runs``, C or its Python twin): an iterator that
pulls the cursor's entries one at a time as the caller asks, checks each, and hands out
``(key, inline value)``, merging in the *overlay*: the memtable's writes and the runs' entries,
read a chunk at a time and merged by whole chunks (the keys up to the smallest last key among
the sources not exhausted are known in every source). A scan that stops after ``n`` entries
reads about ``n`` B-tree entries. An overlay entry is ``(key, item)``: the value (bytes), None
for a key hidden there (a deletion, a tombstone, a write or entry expired at the scan's time),
which hides the B-tree's entry, or ``(partition, offset, expiry)`` for a value in a data file.

A walk stops at what it does not hand out itself (an entry whose value is in a data file, a
damaged entry, the overlay's chunk consumed, the end); the scan's generator
(:mod:`kvlog.index.scan`) then does that part in Python and starts the next walk. Overlay chunks start at :data:`FIRST_CHUNK` entries and
double up to :data:`MAX_CHUNK`.

The B-tree's long keys (see :mod:`kvlog.index.keys`) sort by their real keys only within a
group: at the first one, this path stops and returns the bound from which the caller reads the
rest entry by entry.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from kvlog._native import load
from kvlog.index.memtable import Entry, live_value
from kvlog.index.runs import Buffer
from kvlog.meta.env import CacheDamage
from kvlog.meta.map_gate import Views

if TYPE_CHECKING:
    from kvlog.index import _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")

__all__ = ["CLEARED", "END", "ERROR", "FIRST_CHUNK", "MAX_CHUNK", "OVERLAY", "REFILL", "RESUME", "TREE", "Item",
           "overlay_chunks"]

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
#: Why a walk stopped (its ``state``, see ScanWalk).
END, TREE, OVERLAY, REFILL, ERROR, RESUME, CLEARED = range(1, 8)


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


def _run_source(run: Buffer, views: Views, lower: bytes | None, upper: bytes | None,
                now_ms: int) -> _Fill:
    low = lower

    def fill(size: int) -> tuple[list[tuple[bytes, Any]], int, bool, bytes | None]:
        nonlocal low
        try:
            with views:  # the run is a view of the map (see kvlog.meta.map_gate)
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


def _overlay_chunks(fills: list[_Fill]) -> Iterator[list[tuple[bytes, Any]]]:
    """The sources of ``fills`` (newest first) merged a chunk at a time, hidden keys kept as
    None (they hide the B-tree's entries); chunks grow from :data:`FIRST_CHUNK`."""
    count = len(fills)
    bufs: list[list[tuple[bytes, Any]]] = [[] for _ in fills]
    done = [False] * count
    size = FIRST_CHUNK
    while True:
        for i in range(count):
            while not bufs[i] and not done[i]:
                bufs[i], _to_resolve, done[i], _stop = fills[i](size)
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
            return  # every source exhausted
        if len(parts) == 1:
            yield parts[0]
        else:
            newest: dict[bytes, Any] = {}
            for part in reversed(parts):  # the newer sources last: their entries win
                newest.update(part)
            yield sorted(newest.items())
        if size < MAX_CHUNK:
            size *= 2


def overlay_chunks(front: list[tuple[bytes, Entry]], runs: list[Buffer], views: Views, lower: bytes | None,
                   upper: bytes | None, now_ms: int) -> Iterator[list[tuple[bytes, Any]]] | None:
    """The overlay of a forward scan of ``lower <= key < upper`` at ``now_ms``: the memtable's
    writes ``front`` (sorted, within the range) over the pending ``runs`` (newest first, read
    inside ``views``), a chunk at a time; None when there is neither (the B-tree alone)."""
    if not runs:
        return _overlay_chunks([_memtable_source(front, now_ms)]) if front else None
    fills: list[_Fill] = [_memtable_source(front, now_ms)] if front else []
    for run in runs:
        fills.append(_run_source(run, views, lower, upper, now_ms))
    return _overlay_chunks(fills)
