"""The overlay of a forward scan in Python: the twin of the compiled ``RunMerge`` of ``_runs``
(``_run_merge.h``), which :mod:`kvlog.index._runs_py` exports; :mod:`kvlog.index.merged`
documents its use.

The memtable's writes and the pending runs (newest first) are merged a chunk at a time: the
first chunk finds each run's first entry in the range by binary search, then the sources are
merged key by key, the newest source's entry winning a key and the older ones' checked. Only
positions are kept between chunks, never a view of a run: each chunk reads the runs anew (its
caller holds the map's gate, see :mod:`kvlog.meta.map_gate`).

This module does no I/O.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["RunMerge"]


class RunMerge:
    """A forward scan's overlay: ``front`` (a sorted list of ``(key, memtable entry)``) over
    ``runs`` (index runs, newest first, read in place), keys with ``lower <= key < upper``
    (None: unbounded) of the runs, their entries hidden as at ``now_ms``."""

    def __init__(self, front: list[tuple[bytes, Any]], runs: list[Any], lower: bytes | None,
                 upper: bytes | None, now_ms: int, /) -> None:
        if (not isinstance(front, list) or not isinstance(runs, list)
                or (lower is not None and not isinstance(lower, bytes))
                or (upper is not None and not isinstance(upper, bytes))):
            raise TypeError("RunMerge() takes two lists, bytes or None twice and a time")
        self._now = operator.index(now_ms)
        self._front = front
        self._at = 0
        self._runs = tuple(runs)
        self._lower = lower
        self._upper = upper
        self._pos = [0] * len(self._runs)
        self._end = [0] * len(self._runs)
        self._sought = False

    def chunk(self, size: int, /) -> tuple[list[tuple[bytes, Any]], bool]:
        """The merge's next keys, at most ``size`` of them, in order, each once as ``(key,
        item)``: the front's entry as given, else the newest run's as the scan's item (None for
        a deletion or an entry expired at ``now_ms``, the inline value, or ``(partition, offset,
        expiry or None)``); and whether every source is read. Damage raises ``ValueError``."""
        # The twin of _runs builds on this module: imported once both are loaded.
        from kvlog.index._runs_py import BAD_RUN, Run, open_entry

        size = operator.index(size)
        if size < 1:
            raise ValueError("RunMerge.chunk() takes a size of at least 1")
        pos, end = self._pos, self._end
        opened: list[Run | None] = [None] * len(self._runs)
        for r, run in enumerate(self._runs):
            if not self._sought or pos[r] < end[r]:
                opened[r] = Run(run)
        if not self._sought:
            for r, found in enumerate(opened):
                assert found is not None
                first = found.lower_bound(self._lower) if self._lower is not None else 0
                stop = found.lower_bound(self._upper) if self._upper is not None else found.count
                pos[r], end[r] = first, max(stop, first)
            self._sought = True
        heads: list[bytes] = [b""] * len(self._runs)
        for r, found in enumerate(opened):
            if found is not None and pos[r] < end[r]:
                heads[r] = found.key(pos[r])
        out: list[tuple[bytes, Any]] = []
        front = self._front
        while len(out) < size:
            pair: Any = None
            least: bytes | None = None
            source = -1
            if self._at < len(front):
                pair = front[self._at]
                if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], bytes):
                    raise TypeError("RunMerge()'s front holds (bytes, entry) pairs")
                least = pair[0]
            for r in range(len(heads)):
                if pos[r] < end[r] and (least is None or heads[r] < least):
                    least, source = heads[r], r
            if least is None:
                break
            entry: tuple[bytes, Any] | None = None
            if source < 0:
                entry = pair
                self._at += 1
            for r in range(max(source, 0), len(heads)):
                if pos[r] >= end[r] or heads[r] != least:
                    continue
                run = opened[r]
                assert run is not None
                key, value = run.entry(pos[r])
                if entry is None:
                    entry = (key, self._item(key, value, open_entry))
                pos[r] += 1
                if pos[r] < end[r]:
                    heads[r] = run.key(pos[r])
                    if heads[r] <= key:
                        raise ValueError(BAD_RUN)
            assert entry is not None
            out.append(entry)
        done = self._at >= len(front) and all(p >= e for p, e in zip(pos, end, strict=True))
        return out, done

    def _item(self, key: bytes, value: bytes, open_entry: Any) -> Any:
        """The scan's item of a checked run entry (``value`` empty: a deletion)."""
        if not value:
            return None
        _key, partition, offset, _flags, inline_value, expires = open_entry(key, value)
        if expires is not None and self._now >= expires:
            return None
        if inline_value is not None:
            return inline_value
        return partition, offset, expires
