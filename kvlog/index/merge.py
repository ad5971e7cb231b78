"""Settling: the pending index runs merged into the B-tree in key order, in one transaction.

The runs are merged newest first (:func:`merge_runs`, in C: the newest run's entry of each key
wins, each key once), and the merged entries are written to the B-tree in key order, a chunk of
:data:`MERGE_CHUNK` at a time: sorted writes touch each leaf page once, where writing run after
run would insert every run's keys at random places of the tree. When every merged key sorts
after the tree's last key (an empty tree, or keys that only grow) the entries are appended
(LMDB fills each page and never splits one); otherwise they are written in place, still in key
order.

The runs are read in place (views of the LMDB map, no copy) through a read transaction opened
within the write transaction: it sees the state the write transaction started from, whose
pages no write can reuse while it is open. That is the state of the runs the write transaction
merges unless it changed them itself; if the run list differs the runs are copied instead.

The whole merge is one write transaction with the dropping of the runs: a crash leaves either
the runs or the merged tree, never part of both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lmdb

from kvlog._native import load
from kvlog.index.runs import Buffer
from kvlog.meta.cache import MetaTxn
from kvlog.meta.env import CacheDamage

if TYPE_CHECKING:
    from kvlog.index import _merge
else:
    _merge = load("kvlog.index._merge", "kvlog.index._merge_py")

__all__ = ["MERGE_CHUNK", "merge_runs", "write_merged"]

#: Merged entries turned into Python objects and written at once.
MERGE_CHUNK = 65536


def merge_runs(runs: list[Buffer], lower: bytes | None, limit: int
               ) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """The entries of ``runs`` (newest first) from key ``lower`` (None: the first) on, at most
    ``limit`` (< 0: all), in key order, the newest run's for each key, every one checked: the
    ``(key, index value)`` puts and the deleted keys apart. ``ValueError`` if a run is damaged."""
    found: tuple[list[tuple[bytes, bytes]], list[bytes]] = _merge.merge(runs, lower, limit)
    return found


def write_merged(meta: MetaTxn, numbers: list[bytes]) -> None:
    """Write the merged entries of the runs ``numbers`` (oldest first, the ``runs`` database's
    keys in ``meta``'s transaction) into the B-tree; the caller drops the runs."""
    env = meta.env
    runs_db = env.dbs["runs"]
    reader: Any = None
    try:
        try:
            reader = env.env.begin(db=runs_db, buffers=True)
            with reader.cursor() as cur:
                seen = [(bytes(key), value) for key, value in cur]
        except lmdb.Error:
            seen = []
        runs: list[Buffer]
        if [key for key, _value in seen] == numbers:
            runs = [value for _key, value in reversed(seen)]  # views of the map, newest first
        else:
            runs = [_copy(meta, number) for number in reversed(numbers)]
        _write(meta, runs)
    finally:
        if reader is not None:
            reader.abort()


def _copy(meta: MetaTxn, number: bytes) -> bytes:
    run = meta.txn.get(number, db=meta.env.dbs["runs"])
    assert run is not None
    return bytes(run)


def _write(meta: MetaTxn, runs: list[Buffer]) -> None:
    txn = meta.txn
    index_db = meta.env.dbs["index"]
    with txn.cursor(db=index_db) as cur:
        last = bytes(cur.key()) if cur.last() else None
    append: bool | None = None
    lower: bytes | None = None
    with txn.cursor(db=index_db) as cur:
        while True:
            try:
                puts, deletions = merge_runs(runs, lower, MERGE_CHUNK)
            except ValueError:
                raise CacheDamage("an index run is damaged", index_only=True) from None
            if not puts and not deletions:
                return
            first = min(puts[0][0] if puts else deletions[0], deletions[0] if deletions else puts[0][0])
            if append is None:
                append = last is None or first > last
            if not append:
                for key in deletions:
                    txn.delete(key, db=index_db)
            # Appending, nothing to delete: every merged key is beyond the tree's last.
            if puts:
                _consumed, added = cur.putmulti(puts, append=append)
                if append and added != len(puts):
                    raise CacheDamage("merged index entries out of key order", index_only=True)
            top = max(puts[-1][0] if puts else deletions[-1], deletions[-1] if deletions else puts[-1][0])
            if len(puts) + len(deletions) < MERGE_CHUNK:
                return
            lower = top + b"\x00"
