"""Reading batches from data files: one ranged read each, verified, through a bounded cache;
and the records (or one key's value) they hold."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from kvlog.errors import CorruptDataError
from kvlog.format.bitmap import decode_offsets
from kvlog.format.datafile import decode_batch
from kvlog.index import IndexEntry
from kvlog.log.records import Record
from kvlog.meta import LmdbEnv, MetaReader
from kvlog.meta.records import LiveBatch
from kvlog.storage.base import Storage

__all__ = [
    "BatchCache", "DataFileMissing", "batch_offsets", "records_of_batch", "value_in_batch", "values_in_batches",
]


class DataFileMissing(CorruptDataError):
    """A live batch's data file is not in storage. For a cache behind storage this is no loss:
    another process compacted and its GC deleted the file after a newer commit replaced it, and
    the reader applies the newer commits and reads again (see ``kvlog.log.log.Log``); at the
    newest version it is a real loss."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "the commit carrying this inline data file is missing" if path.startswith("log/")
                         else "data file is missing")
        #: The missing data file.
        self.path = path


class BatchCache:
    """Decoded record batches by (path, position), bounded by their Arrow size in bytes."""

    def __init__(self, storage: Storage, max_bytes: int) -> None:
        self._storage = storage
        self._max = max_bytes
        self._items: OrderedDict[tuple[str, int], pa.RecordBatch] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, batch: LiveBatch) -> pa.RecordBatch:
        """The record batch stored for ``batch`` (a live batch of the catalog)."""
        key = (batch.path, batch.position)
        with self._lock:
            cached = self._items.get(key)
            if cached is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return cached
            self.misses += 1
        location = batch.location
        try:
            data = self._storage.read_range(batch.path, location.position, location.length)
        except FileNotFoundError:
            raise DataFileMissing(batch.path) from None
        record_batch = decode_batch(batch.path, data, location)
        self.put(key, record_batch)
        return record_batch

    def put(self, key: tuple[str, int], record_batch: pa.RecordBatch) -> None:
        """Remember a decoded batch (evicting the least recently used past the bound)."""
        size = record_batch.nbytes
        if size > self._max:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = record_batch
            self._bytes += size
            while self._bytes > self._max and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes


def records_of_batch(
    batch: LiveBatch, partition: int, record_batch: pa.RecordBatch,
    from_offset: int = 0, to_offset: int | None = None,
) -> Iterator[Record]:
    """The live records of a live batch in offset order, within ``[from_offset, to_offset)``."""
    base = batch.base
    keys = record_batch.column(0).to_pylist()
    values = record_batch.column(1).to_pylist()
    stamps = record_batch.column(2).to_pylist()
    expires = record_batch.column(3).to_pylist() if record_batch.num_columns > 3 else None
    present = batch.present
    if present is None:
        offsets: Any = range(base, base + len(keys))
    else:
        bitmap = decode_offsets(batch.path, present)
        if len(bitmap) != len(keys):
            raise CorruptDataError(batch.path, "offset bitmap and batch disagree on the record count")
        offsets = (base + rel for rel in bitmap)
    for i, offset in enumerate(offsets):
        if offset < from_offset:
            continue
        if to_offset is not None and offset >= to_offset:
            return
        yield Record(partition, offset, stamps[i], keys[i], values[i],
                     None if expires is None else expires[i])




def batch_offsets(batch: LiveBatch, record_batch: pa.RecordBatch) -> list[int]:
    """The offsets of a live batch's records, in order (:func:`records_of_batch`'s, without
    making the records)."""
    n = record_batch.num_rows
    if batch.present is None:
        return list(range(batch.base, batch.base + n))
    bitmap = decode_offsets(batch.path, batch.present)
    if len(bitmap) != n:
        raise CorruptDataError(batch.path, "offset bitmap and batch disagree on the record count")
    base = batch.base
    return [base + rel for rel in bitmap]


def value_in_batch(env: LmdbEnv, key: bytes, entry: IndexEntry, batch: LiveBatch,
                   record_batch: pa.RecordBatch) -> bytes:
    """The value of ``key`` at ``entry``'s offset in ``batch`` (whose records are
    ``record_batch``). An offset compaction removed, or a record holding another key or a
    deletion, is damage the checksums missed: ``CorruptDataError`` (the cache ``env`` marks its
    key index for rebuild), never another key's value."""
    where = f"partition {entry.partition} offset {entry.offset}"
    position = entry.offset - batch.base
    if batch.present is not None:
        present = decode_offsets(batch.path, batch.present)
        if position not in present:  # never read a neighbour's value for a removed offset
            raise CorruptDataError(f"partition {entry.partition}", f"offset {entry.offset} is not live")
        position = present.rank(position) - 1
    if not 0 <= position < record_batch.num_rows or record_batch.column(0)[position].as_py() != key:
        raise env.damaged(f"the key index points a key at {where}, which holds another key",
                          index_only=True)
    value = record_batch.column(1)[position].as_py()
    if not isinstance(value, bytes):
        raise env.damaged(f"the key index points a key at {where}, a deletion", index_only=True)
    return value


def values_in_batches(env: LmdbEnv, pairs: list[tuple[bytes, IndexEntry]], reader: MetaReader,
                      read: Callable[[LiveBatch], pa.RecordBatch]) -> list[bytes | None]:
    """The values of ``(key, entry)`` pairs whose values are in data files, in their order: each
    entry's batch looked up in ``reader`` (the entries' snapshot), each batch read once with
    ``read`` for all the keys it holds. An offset no live batch holds is None for an expiring
    record (compaction removed it once it expired) and ``CorruptDataError`` for any other."""
    out: list[bytes | None] = [b""] * len(pairs)
    groups: dict[tuple[str, int], tuple[LiveBatch, list[int]]] = {}
    for i, (_key, entry) in enumerate(pairs):
        if entry.inline is not None:
            out[i] = entry.inline
            continue
        batch = reader.find_batch(entry.partition, entry.offset)
        if batch is None:
            if entry.expires_ms is not None:
                out[i] = None
                continue
            raise CorruptDataError(f"partition {entry.partition}", f"offset {entry.offset} is not live")
        groups.setdefault((batch.path, batch.position), (batch, []))[1].append(i)
    for batch, positions in groups.values():
        record_batch = read(batch)
        for i in positions:
            key, entry = pairs[i]
            out[i] = value_in_batch(env, key, entry, batch, record_batch)
    return out
