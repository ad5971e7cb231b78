"""Forward scans over the memtable's writes, the pending runs (newest first) and the B-tree,
merged with no Python frame per entry.

The B-tree is walked by ``ScanWalk`` (in ``_runs``, C or its Python twin): an iterator that
pulls the cursor's entries one at a time as the caller asks, checks each, and hands out
``(key, inline value)``, merging in the *overlay*: the memtable's writes and the runs' entries,
merged by ``RunMerge`` (in ``_runs`` too) a chunk of keys at a time. Its first chunk finds each
run's first key in the range by binary search; each chunk then merges the sources key by key,
the newest source winning a key, so every chunk's keys are final and a scan that stops after
``n`` entries reads about ``n`` entries of the B-tree and of the overlay, whatever the number of
runs. An overlay entry is ``(key, item)``: the value (bytes), None for a key hidden there (a
run's deletion, an entry expired at the scan's time), which hides the B-tree's entry, ``(partition,
offset, expiry)`` for a value in a data file, or a memtable entry as it stands (a deletion or a
write with a time to live, see :func:`kvlog.index.memtable.live_value`).

A walk stops at what it does not hand out itself (an entry whose value is in a data file, a
damaged entry, an overlay item that is not a value, the overlay's chunk consumed, the end); the
scan's generator (:mod:`kvlog.index.scan`) then does that part in Python and starts the next
walk. Overlay chunks start at :data:`FIRST_CHUNK` keys and double up to :data:`MAX_CHUNK`; each
reads the runs inside one entry of the map's gate.

The B-tree's long keys (see :mod:`kvlog.index.keys`) sort by their real keys only within a
group: at the first one, this path stops and returns the bound from which the caller reads the
rest entry by entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvlog._native import load
from kvlog.index.memtable import Entry
from kvlog.index.runs import Buffer
from kvlog.meta.env import CacheDamage
from kvlog.meta.map_gate import Views

if TYPE_CHECKING:
    from kvlog.index import _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")

__all__ = ["CLEARED", "END", "ERROR", "FIRST_CHUNK", "MAX_CHUNK", "OVERLAY", "REFILL", "RESUME", "TREE", "Item",
           "overlay", "overlay_chunk"]

#: Keys the first chunk of a scan's overlay holds.
FIRST_CHUNK = 16
#: The largest chunk: each next chunk doubles, up to this.
MAX_CHUNK = 512

#: What a scan's entry holds: the value, None (hidden), or (partition, offset, expiry or None)
#: of a value in a data file.
Item = bytes | tuple[int, int, int | None] | None
#: Why a walk stopped (its ``state``, see ScanWalk).
END, TREE, OVERLAY, REFILL, ERROR, RESUME, CLEARED = range(1, 8)


def _run_damage() -> CacheDamage:
    return CacheDamage("an index run is damaged", index_only=True)


def overlay(front: list[tuple[bytes, Entry]], runs: list[Buffer], lower: bytes | None, upper: bytes | None,
            now_ms: int) -> _runs.RunMerge | None:
    """The overlay of a forward scan of ``lower <= key < upper`` at ``now_ms``: the memtable's
    writes ``front`` (sorted, within the range) over the pending ``runs`` (newest first); None
    when there is neither (the B-tree alone). Read a chunk at a time by :func:`overlay_chunk`."""
    if not front and not runs:
        return None
    return _runs.RunMerge(front, runs, lower, upper, now_ms)


def overlay_chunk(merge: _runs.RunMerge, views: Views | None,
                  size: int) -> tuple[list[tuple[bytes, Any]], bool]:
    """The overlay's next ``size`` keys (fewer at its end) and whether it is done, its runs
    read inside ``views`` (one entry of the map's gate, see :mod:`kvlog.meta.map_gate`; None: no
    runs). A memtable entry is its item as it stands (bytes, or an entry for
    :func:`~kvlog.index.memtable.live_value`); damage in a run raises ``CacheDamage``."""
    try:
        if views is None:
            return merge.chunk(size)
        with views:
            return merge.chunk(size)
    except ValueError:
        raise _run_damage() from None
