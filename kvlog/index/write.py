"""Writing the key index within a metadata write transaction (:class:`~kvlog.meta.cache.MetaTxn`).

A commit's index entries are written in the commit's own LMDB transaction, so applying a commit
stays atomic with its catalog changes: as one index run (:func:`add_run`), or straight into the
B-tree. Settling (:func:`settle_runs`) merges the pending runs into the B-tree, in key order. A
write straight into the B-tree first settles the runs, which would otherwise win over it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvlog.format.columns import binary_ends, index_pairs, int64_column, latest_rows, valid_mask
from kvlog.index.entry import decode_entry, encode_index_value
from kvlog.index.expiries import add_rows, drop_expired, prune_rows
from kvlog.index.keys import DIRECT_KEY_BYTES, encode_index_key
from kvlog.index.merge import write_merged
from kvlog.index.runs import RUN_ID, build_run
from kvlog.index.snapshot import runs_pending
from kvlog.meta.cache import MetaTxn
from kvlog.meta.env import CacheDamage

__all__ = [
    "add_run", "clear_index", "index_apply", "index_batch", "index_batches", "index_put", "index_put_many",
    "index_records", "settle_runs",
]

#: Index entries handed to one ``putmulti`` call (their Python objects exist one chunk at a time).
_PUT_CHUNK = 8192


def add_run(meta: MetaTxn, run: bytes) -> None:
    """Append an index run (it wins over every older run and the index)."""
    db = meta.env.dbs["runs"]
    with meta.txn.cursor(db=db) as cur:
        number = RUN_ID.unpack(cur.key())[0] + 1 if cur.last() else 0
    meta.txn.put(RUN_ID.pack(number), run, db=db, append=True)  # the newest: the last key


def settle_runs(meta: MetaTxn, now_ms: int | None = None) -> int:
    """Merge the pending index runs into the index in key order (:mod:`kvlog.index.merge`);
    return how many. With ``now_ms``, the entries expired at that time are deleted too
    (:func:`drop_expired`)."""
    db = meta.env.dbs["runs"]
    with meta.txn.cursor(db=db) as cur:
        numbers = [bytes(number) for number in cur.iternext(values=False)]
    if numbers:
        write_merged(meta, numbers)
        meta.txn.drop(db, delete=False)
        if now_ms is not None:
            drop_expired(meta, now_ms, lambda lmdb_key: _current_expiry(meta, lmdb_key))
        prune_rows(meta, lambda lmdb_key: _current_expiry(meta, lmdb_key))
    return len(numbers)


def _current_expiry(meta: MetaTxn, lmdb_key: bytes) -> int | None:
    """The expiry of ``lmdb_key``'s entry in the B-tree (None: none, or no entry)."""
    value = meta.txn.get(lmdb_key, db=meta.env.dbs["index"])
    if value is None:
        return None
    try:
        return decode_entry(lmdb_key, bytes(value))[1].expires_ms
    except ValueError:
        raise CacheDamage("an index entry is damaged", index_only=True) from None


def _settle(meta: MetaTxn) -> None:
    """Before a write straight into the index: merge the runs, which would otherwise win."""
    if runs_pending(meta):
        settle_runs(meta)


def clear_index(meta: MetaTxn) -> None:
    """Empty the key index and its pending runs."""
    meta.txn.drop(meta.env.dbs["index"], delete=False)
    meta.txn.drop(meta.env.dbs["runs"], delete=False)
    meta.txn.drop(meta.env.dbs["expiries"], delete=False)


def index_put(meta: MetaTxn, key: bytes, partition: int, offset: int, inline: bytes | None,
              expires_ms: int | None = None) -> None:
    """Point ``key`` at ``(partition, offset)``, with its value ``inline`` unless None, expiring
    at ``expires_ms`` unless None."""
    _settle(meta)
    lmdb_key = encode_index_key(key)
    meta.txn.put(lmdb_key, encode_index_value(key, partition, offset, inline, expires_ms),
                 db=meta.env.dbs["index"])
    if expires_ms is not None:
        add_rows(meta, [(expires_ms, lmdb_key)])


def index_apply(
    meta: MetaTxn, partition: int, latest: dict[bytes, tuple[int, bytes | None]], inline_limit: int
) -> None:
    """Point many keys of ``partition`` at ``(offset, value)``; a None value deletes the key."""
    _settle(meta)
    db = meta.env.dbs["index"]
    puts = []
    for key, (offset, value) in latest.items():
        if value is None:
            meta.txn.delete(encode_index_key(key), db=db)
        else:
            puts.append((key, partition, offset, value))
    puts.sort()
    index_put_many(meta, puts, inline_limit)


def index_put_many(meta: MetaTxn, items: list[tuple[bytes, int, int, bytes]], inline_limit: int) -> None:
    """Write ``(key, partition, offset, value)`` entries; values up to ``inline_limit`` inline."""
    _settle(meta)
    puts = []
    for key, partition, offset, value in items:
        if len(key) > DIRECT_KEY_BYTES:
            index_put(meta, key, partition, offset, value if len(value) <= inline_limit else None)
        else:
            inline = value if len(value) <= inline_limit else None
            puts.append((key, encode_index_value(key, partition, offset, inline)))
    if puts:
        with meta.txn.cursor(db=meta.env.dbs["index"]) as cur:
            cur.putmulti(puts)


def index_records(
    meta: MetaTxn, partition: int | np.ndarray, keys: pa.Array, values: pa.Array, offsets: np.ndarray,
    inline_limit: int, run_limit: int = 0, expires: pa.Array | None = None,
) -> None:
    """Point ``keys`` (binary) at ``offsets`` of ``partition`` (one, or one per record) in one
    pass; the last record of a key wins, a null value (a tombstone) deletes it; values up to
    ``inline_limit`` inline; ``expires`` (int64, null: never) gives each record's expiry.

    With ``run_limit`` > 0 and short keys only, the entries become one index run (the caller
    merges the runs, :func:`settle_runs`, once more than ``run_limit`` are pending);
    otherwise they are written into the index at once."""
    n = len(keys)
    if n == 0:
        return
    ends, _data = binary_ends(keys)
    if expires is not None and expires.null_count == len(expires):
        expires = None
    if int(np.diff(ends).max()) > DIRECT_KEY_BYTES:  # long keys: the general path
        parts = np.broadcast_to(np.asarray(partition), (n,)).tolist()
        key_list = keys.to_pylist()
        expiry_list = [None] * n if expires is None else expires.to_pylist()
        for p, key, offset, value, when in zip(parts, key_list, offsets.tolist(), values.to_pylist(),
                                               expiry_list, strict=True):
            if when is None or value is None:
                index_apply(meta, p, {key: (offset, value)}, inline_limit)
            else:
                index_put(meta, key, p, offset, value if len(value) <= inline_limit else None, when)
        return
    chosen = latest_rows(keys)  # each key's last record, in key order
    expiry_at: np.ndarray | None = None
    expiring: np.ndarray | None = None
    if expires is not None:
        live_rows = valid_mask(values)[chosen]
        expiring = np.ascontiguousarray(valid_mask(expires)[chosen] & live_rows)
        expiry_at = np.ascontiguousarray(expires.fill_null(0).to_numpy()[chosen], dtype=np.int64)
        add_rows(meta, zip(expiry_at[expiring].tolist(),
                           keys.take(int64_column(chosen[expiring])).to_pylist(), strict=True))
        if not expiring.any():
            expiry_at = expiring = None
    if run_limit > 0:
        if isinstance(partition, np.ndarray):
            run_parts = partition[chosen]
        else:
            run_parts = np.full(len(chosen), partition, dtype=np.uint16)
        add_run(meta, build_run(keys, values, chosen, run_parts, offsets[chosen],
                                valid_mask(values)[chosen], inline_limit, expiry_at, expiring))
        return
    _settle(meta)
    index_db = meta.env.dbs["index"]
    if values.null_count:
        live = valid_mask(values)[chosen]
        for key in keys.take(int64_column(chosen[~live])).to_pylist():
            meta.txn.delete(key, db=index_db)
        chosen = np.ascontiguousarray(chosen[live])
        if expiring is not None and expiry_at is not None:
            expiring, expiry_at = expiring[live], expiry_at[live]
    m = len(chosen)
    if m == 0:
        return
    if isinstance(partition, np.ndarray):
        parts = np.ascontiguousarray(partition[chosen], dtype=np.uint16)
    else:
        parts = np.full(m, partition, dtype=np.uint16)
    positions = np.ascontiguousarray(offsets[chosen], dtype=np.int64)
    if expiring is not None and expiry_at is not None and expiring.any():
        # Entries with an expiry are encoded here; the compiled encoder writes the others.
        key_list = keys.take(int64_column(chosen[expiring])).to_pylist()
        value_list = values.take(int64_column(chosen[expiring])).to_pylist()
        puts = [
            (key, encode_index_value(key, int(p), int(offset), value if len(value) <= inline_limit else None,
                                     int(when)))
            for key, value, p, offset, when in zip(key_list, value_list, parts[expiring].tolist(),
                                                   positions[expiring].tolist(), expiry_at[expiring].tolist(),
                                                   strict=True)
        ]
        with meta.txn.cursor(db=index_db) as cur:
            cur.putmulti(puts)
        keep = ~expiring
        chosen = np.ascontiguousarray(chosen[keep])
        parts = np.ascontiguousarray(parts[keep])
        positions = np.ascontiguousarray(positions[keep])
        m = len(chosen)
    with meta.txn.cursor(db=index_db) as cur:
        # Python objects for one chunk at a time: a flush's worth at once is tens of MiB.
        for start in range(0, m, _PUT_CHUNK):
            stop = start + _PUT_CHUNK
            cur.putmulti(index_pairs(keys, values, chosen[start:stop], parts[start:stop],
                                     positions[start:stop], inline_limit))


def index_batch(
    meta: MetaTxn, partition: int, base: int, record_batch: pa.RecordBatch, inline_limit: int,
    offsets: list[int] | None = None, run_limit: int = 0,
) -> None:
    """Point the key index at the records of a live batch (later records win; tombstones delete):
    one index run, or straight into the index (``run_limit`` 0)."""
    n = record_batch.num_rows
    if offsets is None:
        positions = np.arange(base, base + n, dtype=np.int64)
    else:
        positions = np.asarray(offsets, dtype=np.int64)
        if len(positions) != n:
            raise ValueError(f"{len(positions)} offsets for {n} records")
    index_records(meta, partition, record_batch.column(0), record_batch.column(1), positions, inline_limit,
                  run_limit, record_batch.column(3) if record_batch.num_columns > 3 else None)


def index_batches(
    meta: MetaTxn, batches: list[tuple[int, int, pa.RecordBatch]], inline_limit: int, run_limit: int = 0,
) -> None:
    """Index the records of ``(partition, base offset, records)`` batches in order (a later batch
    wins), in one sorted pass: one index run, or straight into the index (``run_limit`` 0)."""
    batches = [b for b in batches if b[2].num_rows]
    if len(batches) <= 1:
        for partition, base, records in batches:
            index_batch(meta, partition, base, records, inline_limit, run_limit=run_limit)
        return
    keys = pa.concat_arrays([records.column(0) for _p, _b, records in batches])
    values = pa.concat_arrays([records.column(1) for _p, _b, records in batches])
    positions = np.concatenate([np.arange(base, base + records.num_rows, dtype=np.int64)
                                for _p, base, records in batches])
    partitions = np.concatenate([np.full(records.num_rows, p, dtype=np.int64) for p, _b, records in batches])
    expires = None
    if any(records.num_columns > 3 for _p, _b, records in batches):
        expires = pa.concat_arrays([
            records.column(3) if records.num_columns > 3 else pa.nulls(records.num_rows, pa.int64())
            for _p, _b, records in batches
        ])
    index_records(meta, partitions, keys, values, positions, inline_limit, run_limit, expires)
