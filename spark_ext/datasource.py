"""The ``kvlog`` Python data source: batch reads of the log or the latest state, and append writes.

Planning happens on the driver at one commit version: the driver opens the
store read-only, lists the live batches, and hands each input partition the
batches it reads (view ``log``: one input partition per data file, read with
one GET; view ``latest``: one per kvlog partition, since a key's records all
live in one partition). Executors read Arrow batches themselves and yield
``pyarrow.RecordBatch`` of exactly the declared schema.

Appends: the DataFrame's schema is checked on the driver when the write is
planned (:func:`_check_write_schema`), so a bad one fails before any task runs;
each task is a producer with a deterministic id (from the write job's
id and the task's partition) and sequences from 0, writes its own data file,
and returns its file entry; the driver's ``commit`` makes every task's files
live in one commit; ``abort`` deletes them (they were never referenced).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructType

from kvlog.clock import SystemClock
from kvlog.errors import ConfigError, InvalidRecordError, KvlogError
from kvlog.format.bitmap import decode_offsets
from kvlog.format.commit import BatchEntry, Commit, file_from_json, file_to_json
from kvlog.format.datafile import DataFileWriter, decode_batch, make_record_batch
from kvlog.log import open_log
from kvlog.log.naming import data_file_name
from kvlog.log.records import partition_for_key
from kvlog.meta import LiveBatch
from kvlog.storage import open_storage
from spark_ext.options import driver_cache_dir, storage_options_from, store_uri

__all__ = ["KvlogDataSource", "LOG_SCHEMA", "LATEST_SCHEMA", "live_batches", "read_batches"]

LOG_SCHEMA = ("partition int, offset bigint, timestamp bigint, key binary, value binary, is_tombstone boolean, "
              "expires_ms bigint")
LATEST_SCHEMA = "key binary, value binary, partition int, offset bigint, timestamp bigint, expires_ms bigint"
_LOG_INTERNAL = LOG_SCHEMA + ", horizon bigint"

_LOG_ARROW = pa.schema([
    ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64()), ("key", pa.binary()),
    ("value", pa.binary()), ("is_tombstone", pa.bool_()), ("expires_ms", pa.int64()),
])
_LOG_INTERNAL_ARROW = _LOG_ARROW.append(pa.field("horizon", pa.int64()))
_LATEST_ARROW = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.int64()), ("expires_ms", pa.int64()),
])


def _expires(record_batch: pa.RecordBatch) -> pa.Array:
    """The ``expires`` column of a data-file batch (all null for a format 1 batch)."""
    if record_batch.num_columns > 3:
        return record_batch.column(3)
    return pa.nulls(record_batch.num_rows, pa.int64())


#: The columns of a DataFrame appended to a store, as the error of a bad schema names them.
_WRITE_COLUMNS = ("'key' (binary or string), 'value' (binary or string; null deletes the key) "
                 "and optionally 'timestamp' (bigint, milliseconds)")


def _check_write_schema(schema: StructType) -> None:
    """Refuse a DataFrame that is not exactly ``key``, ``value`` and optionally ``timestamp``.

    Called on the driver while the write is planned, so no task runs and nothing is written.
    A missing ``value`` column in particular must not be read as all-null values: that
    would append a tombstone for every key. Every problem found is named in one
    ``InvalidRecordError``, with the columns expected.
    """
    allowed: dict[str, tuple[type, ...]] = {"key": (BinaryType, StringType), "value": (BinaryType, StringType),
                                            "timestamp": (LongType,)}
    names = [f.name for f in schema.fields]
    problems = [f"no '{name}' column" for name in ("key", "value") if name not in names]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"the column '{name}' appears {names.count(name)} times")
    for field in schema.fields:
        if field.name not in allowed:
            problems.append(f"unknown column '{field.name}'")
        elif not isinstance(field.dataType, allowed[field.name]):
            wanted = "bigint" if field.name == "timestamp" else "binary or string"
            problems.append(f"'{field.name}' is {field.dataType.simpleString()}, not {wanted}")
    if problems:
        raise InvalidRecordError(
            f"a DataFrame written to kvlog has the columns {_WRITE_COLUMNS}; this one has "
            f"{', '.join(f'{f.name} {f.dataType.simpleString()}' for f in schema.fields) or 'no columns'}: "
            f"{'; '.join(problems)}. Nothing was written."
        )


def live_batches(uri: str, storage_options: dict[str, Any] | None, cache_dir: str | None = None
                 ) -> tuple[int, int, list[LiveBatch]]:
    """(version, partitions, every live batch in partition then offset order) at the newest version."""
    the_log = open_log(uri, create=False, read_only=True, storage_options=storage_options,
                       cache_dir=driver_cache_dir(uri, cache_dir), maintain_index=False)
    try:
        def collect(r: Any) -> list[LiveBatch]:
            return [b for p in range(the_log.partitions) for b in r.iter_batches(p, 0)]

        return the_log.version, the_log.partitions, the_log.snapshot(collect)
    finally:
        the_log.close()


def _offsets(batch: LiveBatch) -> pa.Array:
    base = batch.base
    if batch.present is None:
        return pa.array(range(base, batch.last + 1), pa.int64())
    bitmap = decode_offsets(batch.path, batch.present)
    return pc.add(pa.array(list(bitmap), pa.int64()), base)


def read_batches(storage: Any, batches: Sequence[LiveBatch], *, whole_file: bool) -> Iterator[
        tuple[LiveBatch, pa.RecordBatch]]:
    """Decode ``batches`` (one GET of the whole file when ``whole_file``, else one ranged GET each)."""
    data: bytes | None = None
    if whole_file and batches:
        data = storage.read(batches[0].path)
    for b in batches:
        loc = b.location
        raw = data[b.position:b.position + b.length] if data is not None else storage.read_range(
            b.path, b.position, b.length)
        yield b, decode_batch(b.path, raw, loc)


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str], view: str, internal: bool) -> None:
        self.uri = store_uri(options)
        self.storage_options = storage_options_from(options)
        self.view = view
        self.internal = internal
        self.cache_dir = options.get("cache_dir") or None
        self.partitions_wanted: set[int] | None = None
        self.offset_min: int | None = None
        self.offset_max: int | None = None  # exclusive
        #: The job's time: the latest view hides records expired at it (option ``now_ms``, else
        #: the driver's clock when the read is planned).
        self.now_ms = int(options["now_ms"]) if options.get("now_ms") else SystemClock().now_ms()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802 - Spark's name
        for f in filters:
            attribute = getattr(f, "attribute", None)
            column = attribute[0] if attribute else None
            if self.view == "log" and column == "partition" and isinstance(f, EqualTo | In):
                values = {int(v) for v in (f.value if isinstance(f, In) else (f.value,))}
                self.partitions_wanted = values if self.partitions_wanted is None else self.partitions_wanted & values
            elif self.view == "log" and column == "offset" and isinstance(
                    f, GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual):
                v = int(f.value)
                if isinstance(f, GreaterThan | GreaterThanOrEqual):
                    lo = v + 1 if isinstance(f, GreaterThan) else v
                    self.offset_min = lo if self.offset_min is None else max(self.offset_min, lo)
                else:
                    hi = v if isinstance(f, LessThan) else v + 1
                    self.offset_max = hi if self.offset_max is None else min(self.offset_max, hi)
            else:
                yield f

    def partitions(self) -> list[InputPartition]:
        _version, _n, batches = live_batches(self.uri, self.storage_options, self.cache_dir)
        if self.partitions_wanted is not None:
            batches = [b for b in batches if b.partition in self.partitions_wanted]
        if self.offset_min is not None:
            batches = [b for b in batches if b.last >= self.offset_min]
        if self.offset_max is not None:
            batches = [b for b in batches if b.base < self.offset_max]
        groups: dict[Any, list[LiveBatch]] = {}
        for b in batches:
            groups.setdefault(b.path if self.view == "log" else b.partition, []).append(b)
        if self.view == "log":
            for items in groups.values():
                items.sort(key=lambda b: b.position)
        parts = [InputPartition(items) for _k, items in sorted(groups.items(), key=lambda kv: str(kv[0]))]
        return parts or [InputPartition([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batches: list[LiveBatch] = partition.value
        if not batches:
            return
        storage = open_storage(self.uri, self.storage_options)
        try:
            if self.view == "log":
                yield from self._read_log(storage, batches)
            else:
                yield from self._read_latest(storage, batches)
        finally:
            storage.close()

    def _read_log(self, storage: Any, batches: list[LiveBatch]) -> Iterator[pa.RecordBatch]:
        for b, rb in read_batches(storage, batches, whole_file=True):
            offsets = _offsets(b)
            values = rb.column(1)
            n = rb.num_rows
            columns = [pa.array([b.partition] * n, pa.int32()), offsets, rb.column(2), rb.column(0), values,
                       pc.is_null(values), _expires(rb)]
            schema = _LOG_ARROW
            if self.internal:
                columns.append(pa.array([b.horizon_ms] * n, pa.int64()))
                schema = _LOG_INTERNAL_ARROW
            out = pa.record_batch(columns, schema=schema)
            if self.offset_min is not None or self.offset_max is not None:
                mask = pa.array([True] * n)
                if self.offset_min is not None:
                    mask = pc.and_(mask, pc.greater_equal(offsets, self.offset_min))
                if self.offset_max is not None:
                    mask = pc.and_(mask, pc.less(offsets, self.offset_max))
                out = out.filter(mask)
            if out.num_rows:
                yield out

    def _read_latest(self, storage: Any, batches: list[LiveBatch]) -> Iterator[pa.RecordBatch]:
        """Newest first: the first record seen of each key is its latest; tombstones, and records
        expired at the job's time, hide the key."""
        seen: set[bytes] = set()
        now_ms = self.now_ms
        # One ranged read per batch, newest first and lazily: a task holds one batch at a time
        # (and the keys seen), never its whole partition.
        for b, rb in read_batches(storage, batches[::-1], whole_file=False):
            keys = rb.column(0).to_pylist()
            values = rb.column(1)
            live = pc.is_valid(values).to_pylist()
            expires = _expires(rb)
            when = expires.to_pylist() if expires.null_count < len(expires) else None
            offsets = _offsets(b)
            take = []
            for i in range(len(keys) - 1, -1, -1):
                if keys[i] in seen:
                    continue
                seen.add(keys[i])
                if live[i] and (when is None or when[i] is None or now_ms < when[i]):
                    take.append(i)
            if not take:
                continue
            idx = pa.array(take, pa.int64())
            n = len(take)
            yield pa.record_batch([
                rb.column(0).take(idx), values.take(idx), pa.array([b.partition] * n, pa.int32()),
                offsets.take(idx), rb.column(2).take(idx), expires.take(idx),
            ], schema=_LATEST_ARROW)


class _Writer(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.uri = store_uri(options)
        self.storage_options = storage_options_from(options)
        self.cache_dir = options.get("cache_dir") or None
        self.job_id = uuid.uuid4().hex
        the_log = open_log(self.uri, create=False, read_only=True, storage_options=self.storage_options,
                           cache_dir=driver_cache_dir(self.uri, self.cache_dir), maintain_index=False)
        try:
            self.partitions = the_log.partitions
            self.compression = the_log.config.compression
            self.max_key_bytes = the_log.config.max_key_bytes
            self.max_record_bytes = the_log.config.max_record_bytes
        finally:
            the_log.close()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        producer_id = xxhash.xxh3_64_intdigest(f"{self.job_id}:{task}".encode()) >> 1
        keys: dict[int, list[bytes]] = {}
        values: dict[int, list[bytes | None]] = {}
        stamps: dict[int, list[int]] = {}
        now = SystemClock().now_ms()  # records without a timestamp column are stamped now, as put() does
        for batch in iterator:
            key_col = batch.column("key")
            if key_col.null_count:
                raise InvalidRecordError("a kvlog key may not be null")
            value_col = batch.column("value")
            ts_col = batch.column("timestamp").to_pylist() if "timestamp" in batch.schema.names else None
            for i, (k, v) in enumerate(zip(_as_bytes(key_col), _as_bytes(value_col), strict=True)):
                if not k or len(k) > self.max_key_bytes:
                    raise InvalidRecordError(f"a kvlog key must be 1..{self.max_key_bytes} bytes")
                if len(k) + (len(v) if v is not None else 0) > self.max_record_bytes:
                    raise InvalidRecordError("a record is larger than max_record_bytes")
                p = partition_for_key(k, self.partitions)
                keys.setdefault(p, []).append(k)
                values.setdefault(p, []).append(v)
                stamps.setdefault(p, []).append(int(ts_col[i]) if ts_col and ts_col[i] is not None else now)
        if not keys:
            return _Files([])
        writer = DataFileWriter(self.compression)
        order = sorted(keys)
        for p in order:
            writer.add(make_record_batch(keys[p], values[p], stamps[p]))
        data, locations = writer.finish()
        file_id = uuid.uuid4().hex
        path = data_file_name(0, file_id)
        entries = tuple(BatchEntry(partition=p, location=loc, producer_id=producer_id, epoch=0, base_sequence=0)
                        for p, loc in zip(order, locations, strict=True))
        from kvlog.format.checksum import crc32c
        from kvlog.format.commit import FileEntry

        entry = FileEntry(file_id, path, 0, len(data), crc32c(data), entries)
        storage = open_storage(self.uri, self.storage_options)
        try:
            storage.put(path, data)
        finally:
            storage.close()
        return _Files([json.dumps(file_to_json(entry))])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [file_from_json("spark task", json.loads(f)) for m in messages if isinstance(m, _Files)
                 for f in m.files]
        if not files:
            return
        the_log = open_log(self.uri, create=False, storage_options=self.storage_options,
                           cache_dir=driver_cache_dir(self.uri, self.cache_dir), maintain_index=False)
        try:
            commit_id = uuid.uuid4().hex
            outcome = the_log.commit(lambda v: Commit(v, commit_id, the_log.clock.now_ms(), "append",
                                                      add=tuple(files)))
        finally:
            the_log.close()
        if outcome.refusal is not None:
            raise KvlogError(f"the append commit was refused: {outcome.refusal.message}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        storage = open_storage(self.uri, self.storage_options)
        try:
            for m in messages:
                for f in (m.files if isinstance(m, _Files) else []):
                    storage.delete(json.loads(f)["path"])
        finally:
            storage.close()


@dataclass
class _Files(WriterCommitMessage):
    files: list[str]


def _as_bytes(column: pa.Array) -> list[bytes | None]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [None if v is None else v.encode("utf-8") for v in column.to_pylist()]
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type) or pa.types.is_null(column.type):
        return column.to_pylist()  # type: ignore[no-any-return]
    raise InvalidRecordError(f"kvlog keys and values are binary or string columns, not {column.type}")


class KvlogDataSource(DataSource):
    """``spark.read.format("kvlog").option("view", "log" | "latest").load(uri)`` and append writes."""

    @classmethod
    def name(cls) -> str:
        return "kvlog"

    def _view(self) -> str:
        view = str(self.options.get("view", "log")).lower()
        if view not in ("log", "latest"):
            raise ConfigError(f"view={view!r}: use 'log' or 'latest'")
        return view

    def _internal(self) -> bool:
        return str(self.options.get("internal", "false")).lower() == "true"

    def schema(self) -> str:
        if self._view() == "latest":
            return LATEST_SCHEMA
        return _LOG_INTERNAL if self._internal() else LOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(dict(self.options), self._view(), self._internal())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise ConfigError("the kvlog data source only appends: use .mode('append')")
        _check_write_schema(schema)  # on the driver, before the store is opened or any task runs
        return _Writer(dict(self.options), schema)
