"""The ``expiries`` database: one row per expiring index entry written, so counting live keys
never reads every entry.

A row's LMDB key is the expiry time (ms since the epoch, offset by 2**63 so big-endian bytes
sort as the signed times do) followed by the entry's LMDB key; its value is the row key's seal
(:func:`~kvlog.meta.env.seal` of an empty payload), so a damaged row key fails its check, both
when a read meets it and in the check of a cache changed since its clean close. Rows are
written with the index entries, in the same transaction. An entry that a later write replaced
leaves its row behind (a write does not read the entry it replaces): a row counts only while
the key's current entry carries that very expiry. So the live keys at ``now`` are the index's
entries minus the rows expired at ``now`` whose key's current entry still has the row's expiry
(:func:`expired_entries`). Rows whose entry is gone or changed are deleted when the runs are
settled, once there are twice as many rows as the last such pruning left
(:func:`prune_rows`). Entries expired at the clock's time are deleted from the index, with
their rows, when the runs are settled (:func:`drop_expired`): reads hide them anyway, and a
record compaction removed then has no entry left at all.

A damaged row cannot turn into a wrong answer: reads check each entry's own expiry, every row
is checked against a checksummed entry before it counts, and a row whose key was changed
(its expiry moved, which would leave its entry uncounted in ``len`` once it expires) fails its
seal.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator

import lmdb

from kvlog.meta.cache import MetaTxn
from kvlog.meta.env import seal, unseal

__all__ = ["add_rows", "drop_expired", "expired_entries", "prune_rows", "row_key"]

_WHEN = struct.Struct(">Q")
_BIAS = 1 << 63
#: Meta key: the rows left after the last pruning.
_PRUNED = "expiries_pruned"
#: Rows below which pruning never runs.
_PRUNE_FLOOR = 1024


def row_key(expires_ms: int, lmdb_key: bytes) -> bytes:
    """The LMDB key of the row of an entry of ``lmdb_key`` expiring at ``expires_ms``."""
    return _WHEN.pack(expires_ms + _BIAS) + lmdb_key


def _split(row: bytes, value: bytes | memoryview) -> tuple[int, bytes]:
    """The expiry and entry key of a row, once its value's seal is checked (``CacheDamage``)."""
    unseal(row, value)
    return _WHEN.unpack_from(row)[0] - _BIAS, row[_WHEN.size:]


def add_rows(meta: MetaTxn, rows: Iterable[tuple[int, bytes]]) -> None:
    """Record ``(expires_ms, lmdb_key)`` of expiring entries being written."""
    keys = [row_key(expires, lmdb_key) for expires, lmdb_key in rows]
    items = [(key, seal(key, b"")) for key in keys]
    if items:
        with meta.txn.cursor(db=meta.env.dbs["expiries"]) as cur:
            cur.putmulti(items)


def expired_entries(txn: lmdb.Transaction, db: lmdb._Database, now_ms: int,
                    expiry_of: Callable[[bytes], int | None]) -> int:
    """How many current entries have expired at ``now_ms``: rows with an expiry at or before
    ``now_ms`` whose key's current entry (``expiry_of(lmdb_key)``: its expiry, None for none or
    no entry) has that expiry. Reads the expired rows only."""
    seen: set[bytes] = set()
    for expires, lmdb_key in _rows_until(txn, db, now_ms):
        if lmdb_key not in seen and expiry_of(lmdb_key) == expires:
            seen.add(lmdb_key)
    return len(seen)


def _rows_until(txn: lmdb.Transaction, db: lmdb._Database, now_ms: int) -> Iterator[tuple[int, bytes]]:
    with txn.cursor(db=db) as cur:
        if not cur.first():
            return
        for row, value in cur.iternext():
            expires, lmdb_key = _split(bytes(row), value)
            if expires > now_ms:
                return
            yield expires, lmdb_key


def prune_rows(meta: MetaTxn, expiry_of: Callable[[bytes], int | None]) -> int:
    """Delete the rows whose key's current entry (in the B-tree: call with no run pending) does
    not carry the row's expiry, when there are twice as many rows as the last pruning left (and
    at least a thousand); returns how many went."""
    db = meta.env.dbs["expiries"]
    rows = int(meta.txn.stat(db)["entries"])
    last = meta.get_meta(_PRUNED)
    if rows < max(_PRUNE_FLOOR, 2 * int(last or b"0")):
        return 0
    stale = []
    with meta.txn.cursor(db=db) as cur:
        for row, value in cur.iternext():
            expires, lmdb_key = _split(bytes(row), value)
            if expiry_of(lmdb_key) != expires:
                stale.append(bytes(row))
    for row in stale:
        meta.txn.delete(row, db=db)
    meta.put_meta(_PRUNED, str(rows - len(stale)).encode())
    return len(stale)


def drop_expired(meta: MetaTxn, now_ms: int, expiry_of: Callable[[bytes], int | None]) -> int:
    """Delete the index entries (in the B-tree: call with no run pending) expired at ``now_ms``,
    and the rows of expiries up to ``now_ms``; returns how many entries went."""
    db = meta.env.dbs["expiries"]
    index_db = meta.env.dbs["index"]
    rows = list(_rows_until(meta.txn, db, now_ms))
    dropped = 0
    for expires, lmdb_key in rows:
        if expiry_of(lmdb_key) == expires:
            meta.txn.delete(lmdb_key, db=index_db)
            dropped += 1
        meta.txn.delete(row_key(expires, lmdb_key), db=db)
    return dropped
