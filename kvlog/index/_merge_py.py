"""Merging index runs in Python: the twin of the compiled ``_merge`` (same function, results and
errors); :mod:`kvlog._native` picks one of them. :mod:`kvlog.index.merge` documents its use.

Nothing here trusts its input: runs are read through the checked reader of the ``_runs`` twin,
every entry returned is checked (its CRC32C), keys must strictly increase within each run, and
damage raises ``ValueError``.

This module does no I/O.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterator
from typing import Any

from kvlog.index._runs_py import BAD_RUN, Run, _bound

__all__ = ["merge"]

#: Any object with the buffer protocol: bytes, memoryview, a numpy array, an Arrow buffer.
Buffer = Any


def _keys(run: Run, first: int, rank: int) -> Iterator[tuple[bytes, int, int]]:
    """``(key, rank, entry number)`` of ``run`` from entry ``first``, damage raised as met."""
    previous: bytes | None = None
    for i in range(first, run.count):
        key = run.key(i)
        if not key or len(key) > 480 or (previous is not None and previous >= key):
            raise ValueError(BAD_RUN)
        previous = key
        yield key, rank, i


def merge(runs: list[Any], lower: Buffer | None, limit: int, /
          ) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """The entries from key ``lower`` (None: the first key) on, at most ``limit`` (< 0: all), in
    key order: for each key, the entry of the first of ``runs`` (newest first) holding one, its
    value checked. Returns the ``(key, value)`` puts and the deleted keys apart."""
    if not isinstance(runs, list):
        raise TypeError("merge() takes a list of runs")
    limit = operator.index(limit)
    low = _bound(lower)
    opened = [Run(run) for run in runs]
    walks = [_keys(run, run.lower_bound(low) if low is not None else 0, rank)
             for rank, run in enumerate(opened)]
    puts: list[tuple[bytes, bytes]] = []
    deletions: list[bytes] = []
    last: bytes | None = None
    taken = 0
    for key, rank, i in heapq.merge(*walks):
        if key == last:
            continue  # an older run's entry for a key already listed
        if 0 <= limit <= taken:
            break
        _key, value = opened[rank].entry(i)
        if value:
            puts.append((key, value))
        else:
            deletions.append(key)
        last = key
        taken += 1
    return puts, deletions
