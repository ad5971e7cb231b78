"""The index runs pending in LMDB: read newest first, searched, pinned, and walked merged.

The ``runs`` database holds the runs of commits not merged into the B-tree yet, numbered oldest
first (:data:`~kvlog.index.runs.RUN_ID`). A key's entry is the newest run's that holds it, else
the B-tree's. Damage found in a run is raised as ``CacheDamage`` (``ValueError`` by the plain
:func:`find_in_runs`, for a caller's own fast path).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import TypeVar, cast

import lmdb

from kvlog.index.keys import DIRECT_KEY_BYTES
from kvlog.index.runs import Buffer, runs_find, walk_run
from kvlog.meta.env import CacheDamage, LmdbEnv
from kvlog.meta.map_gate import Views

T = TypeVar("T")
_DONE = object()

__all__ = ["Pinned", "PinnedRuns", "guarded", "find_in_runs", "find_in_runs_checked", "merge_runs", "runs_newest_first", "walk_run_checked"]


def runs_newest_first(txn: lmdb.Transaction, runs_db: lmdb._Database) -> list[Buffer]:
    """The runs of ``txn``'s snapshot, newest first (views or copies, as ``txn`` makes them)."""
    with txn.cursor(db=runs_db) as cur:
        return [value for _key, value in cur.iterprev()] if cur.last() else []


def find_in_runs(runs: list[Buffer], lmdb_key: bytes) -> bytes | None:
    """The newest run's entry for a key (``b""``: deleted), or None if no run has one; the entry
    is checked (its CRC32C), and ``ValueError`` raised if it or the run is damaged."""
    if len(lmdb_key) > DIRECT_KEY_BYTES:
        return None  # runs hold short keys only; a long key's LMDB key is longer
    return runs_find(runs, lmdb_key)


def find_in_runs_checked(runs: list[Buffer], lmdb_key: bytes) -> bytes | None:
    """:func:`find_in_runs`, damage raised as ``CacheDamage``."""
    try:
        return find_in_runs(runs, lmdb_key)
    except ValueError:
        raise CacheDamage("an index run is damaged", index_only=True) from None


#: A pinned snapshot's runs: ``(snapshot id, the transaction keeping its views valid, the runs
#: newest first, the tag of the views)`` (see :mod:`kvlog.meta.map_gate`).
Pinned = tuple[int, lmdb.Transaction | None, list[Buffer], int]


class PinnedRuns:
    """The index runs of the newest snapshot a reader asked for, as views of the LMDB map kept
    valid by a read transaction of that snapshot, until a newer snapshot replaces it (so gets
    that meet pending runs do not read the run directory each time) or the map is resized.
    The views are read inside the environment's gate, with their tag."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.dbs["runs"]
        # Replaced whole, so a reader holding the tuple keeps its transaction alive while it
        # searches.
        self._pinned: Pinned = (-1, None, [], -1)

    def runs(self, snapshot: int) -> tuple[list[Buffer], int] | None:
        """The runs of LMDB snapshot ``snapshot`` and the tag of their views; None if it is no
        longer the newest."""
        pinned = self.pinned(snapshot)
        return None if pinned is None else (pinned[2], pinned[3])

    def pinned(self, snapshot: int) -> Pinned | None:
        """The pin of LMDB snapshot ``snapshot`` (see :data:`Pinned`), to hold as long as the
        runs are read; None if it is no longer the newest."""
        pinned = self._pinned
        gate = self._env.gate
        if pinned[0] == snapshot and pinned[1] is not None and gate.valid(pinned[3]):
            return pinned
        try:
            views, tag = self._env.begin_views()
        except lmdb.Error:
            return None
        if views.id() != snapshot:
            views.abort()
            return None
        pinned = (snapshot, views, runs_newest_first(views, self._db), tag)
        self._pinned = pinned
        return pinned

    def release(self) -> None:
        """Let the pinned snapshot go (its pages can be reused)."""
        if self._pinned[1] is not None:
            self._pinned = (-1, None, [], -1)


def walk_run_checked(run: Buffer, lower: bytes | None, upper: bytes | None, *,
                     reverse: bool) -> Iterator[tuple[bytes, bytes]]:
    """:func:`~kvlog.index.runs.walk_run`, damage raised as ``CacheDamage``."""
    try:
        yield from walk_run(run, lower, upper, reverse=reverse)
    except ValueError:
        raise CacheDamage("an index run is damaged", index_only=True) from None


def _tagged(run: Buffer, age: int, lower: bytes | None, upper: bytes | None,
            reverse: bool) -> Iterator[tuple[bytes, bytes, int]]:
    for key, value in walk_run_checked(run, lower, upper, reverse=reverse):
        yield key, value, age


def guarded(views: Views, entries: Iterator[T]) -> Iterator[T]:
    """``entries``, each drawn inside ``views`` (a lazy walk of run views: see
    :mod:`kvlog.meta.map_gate`)."""
    while True:
        with views:
            entry = next(entries, _DONE)
        if entry is _DONE:
            return
        yield cast(T, entry)


def merge_runs(runs: list[Buffer], lower: bytes | None, upper: bytes | None, *,
               reverse: bool) -> Iterator[tuple[bytes, bytes]]:
    """The entries of runs (newest first) with ``lower <= key < upper`` in key order (or
    reverse), the newest entry of each key only (``b""``: deleted)."""
    if len(runs) == 1:
        yield from walk_run_checked(runs[0], lower, upper, reverse=reverse)
        return
    streams = [_tagged(run, age, lower, upper, reverse) for age, run in enumerate(runs)]
    # Equal keys come newest (age 0) first either way.
    order: Callable[[tuple[bytes, bytes, int]], tuple[bytes, int]] = (
        (lambda e: (e[0], -e[2])) if reverse else (lambda e: (e[0], e[2]))
    )
    last = None
    for key, value, _age in heapq.merge(*streams, key=order, reverse=reverse):
        if key != last:
            last = key
            yield key, value
