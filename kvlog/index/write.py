"""Writing the key index within a metadata write transaction (:class:`~kvlog.meta.cache.MetaTxn`).

A commit's index entries are written in the commit's own LMDB transaction, so applying a commit
stays atomic with its catalog changes: as one index run (:func:`add_run`), or straight into the
B-tree. Settling (:func:`settle_runs`) merges the pending runs into the B-tree, oldest first. A
write straight into the B-tree first settles the runs, which would otherwise win over it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvlog.format.columns import binary_ends, index_pairs, int64_column, latest_rows, valid_mask
from kvlog.index.entry import encode_index_value
from kvlog.index.keys import DIRECT_KEY_BYTES, encode_index_key
from kvlog.index.runs import RUN_ID, build_run, run_entries
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
    """Append an index run (it wins over every earlier run and the index)."""
    db = meta.env.dbs["runs"]
    with meta.txn.cursor(db=db) as cur:
        number = RUN_ID.unpack(cur.key())[0] + 1 if cur.last() else 0
    meta.txn.put(RUN_ID.pack(number), run, db=db, append=True)  # the newest: the last key


def settle_runs(meta: MetaTxn) -> int:
    """Merge the pending index runs into the index, oldest first; return how many."""
    db = meta.env.dbs["runs"]
    index_db = meta.env.dbs["index"]
    txn = meta.txn
    with txn.cursor(db=db) as cur:
        numbers = [bytes(number) for number in cur.iternext(values=False)]
    for number in numbers:
        run = txn.get(number, db=db)  # a copy (this transaction makes bytes): one at a time
        assert run is not None
        lower: bytes | None = None
        while True:
            try:
                chunk = run_entries(run, lower, None, _PUT_CHUNK)  # every entry checked
            except ValueError:
                raise CacheDamage("an index run is damaged", index_only=True) from None
            puts = [pair for pair in chunk if pair[1]]
            if len(puts) != len(chunk):
                for key, value in chunk:
                    if not value:
                        txn.delete(key, db=index_db)
            if puts:
                with txn.cursor(db=index_db) as cur:
                    cur.putmulti(puts)
            if len(chunk) < _PUT_CHUNK:
                break
            lower = chunk[-1][0] + b"\x00"
    if numbers:
        txn.drop(db, delete=False)
    return len(numbers)


def _settle(meta: MetaTxn) -> None:
    """Before a write straight into the index: merge the runs, which would otherwise win."""
    if runs_pending(meta):
        settle_runs(meta)


def clear_index(meta: MetaTxn) -> None:
    """Empty the key index and its pending runs."""
    meta.txn.drop(meta.env.dbs["index"], delete=False)
    meta.txn.drop(meta.env.dbs["runs"], delete=False)


def index_put(meta: MetaTxn, key: bytes, partition: int, offset: int, inline: bytes | None) -> None:
    """Point ``key`` at ``(partition, offset)``, with its value ``inline`` unless None."""
    _settle(meta)
    meta.txn.put(encode_index_key(key), encode_index_value(key, partition, offset, inline),
                 db=meta.env.dbs["index"])


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
    inline_limit: int, run_limit: int = 0,
) -> None:
    """Point ``keys`` (binary) at ``offsets`` of ``partition`` (one, or one per record) in one
    pass; the last record of a key wins, a null value (a tombstone) deletes it; values up to
    ``inline_limit`` inline.

    With ``run_limit`` > 0 and short keys only, the entries become one index run (the caller
    merges the runs, :func:`settle_runs`, once more than ``run_limit`` are pending);
    otherwise they are written into the index at once."""
    n = len(keys)
    if n == 0:
        return
    ends, _data = binary_ends(keys)
    if int(np.diff(ends).max()) > DIRECT_KEY_BYTES:  # long keys: the general path
        parts = np.broadcast_to(np.asarray(partition), (n,)).tolist()
        key_list = keys.to_pylist()
        for p, key, offset, value in zip(parts, key_list, offsets.tolist(), values.to_pylist(), strict=True):
            index_apply(meta, p, {key: (offset, value)}, inline_limit)
        return
    chosen = latest_rows(keys)  # each key's last record, in key order
    if run_limit > 0:
        if isinstance(partition, np.ndarray):
            run_parts = partition[chosen]
        else:
            run_parts = np.full(len(chosen), partition, dtype=np.uint16)
        add_run(meta, build_run(keys, values, chosen, run_parts, offsets[chosen],
                                valid_mask(values)[chosen], inline_limit))
        return
    _settle(meta)
    index_db = meta.env.dbs["index"]
    if values.null_count:
        live = valid_mask(values)[chosen]
        for key in keys.take(int64_column(chosen[~live])).to_pylist():
            meta.txn.delete(key, db=index_db)
        chosen = np.ascontiguousarray(chosen[live])
    m = len(chosen)
    if m == 0:
        return
    if isinstance(partition, np.ndarray):
        parts = np.ascontiguousarray(partition[chosen], dtype=np.uint16)
    else:
        parts = np.full(m, partition, dtype=np.uint16)
    positions = np.ascontiguousarray(offsets[chosen], dtype=np.int64)
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
                  run_limit)


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
    index_records(meta, partitions, keys, values, positions, inline_limit, run_limit)
