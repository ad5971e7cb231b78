"""Writes of the ``kvlog`` data source: ``append`` and ``overwrite``.

The DataFrame's schema is checked on the driver when the write is planned
(:func:`check_write_schema`), so a bad one fails before any task runs; then
the options are validated and a missing store is created
(:func:`spark_ext.savemodes.prepare_store`). Each task is a producer with a
deterministic id (from the write job's id and the task's partition) and
sequences from 0, writes its own data file, and returns its file entry; the
driver's ``commit`` makes every task's files live in one commit (for an
overwrite, with the tombstones of :mod:`spark_ext.overwrite`); ``abort``
deletes the files that are not live.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import xxhash
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, LongType, StringType, StructType

from kvlog.clock import SystemClock
from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.format.commit import BatchEntry, file_from_json, file_to_json
from kvlog.format.datafile import DataFileWriter, make_record_batch
from kvlog.log import commit_files, open_log
from kvlog.log.naming import data_file_name
from kvlog.log.records import partition_for_key
from kvlog.storage import open_storage
from spark_ext.options import driver_cache_dir, storage_options_from, store_uri
from spark_ext.overwrite import OverwriteTarget, commit_overwrite
from spark_ext.savemodes import prepare_store

__all__ = ["KvlogWriter", "check_write_schema"]


#: The columns of a DataFrame appended to a store, as the error of a bad schema names them.
_WRITE_COLUMNS = ("'key' (binary or string), 'value' (binary or string; null deletes the key) "
                 "and optionally 'timestamp' (bigint, milliseconds)")


def check_write_schema(schema: StructType) -> None:
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


class KvlogWriter(DataSourceArrowWriter):
    """Appends (``overwrite=False``) or overwrites; planned on the driver, see the module doc."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool = False) -> None:
        self.uri = store_uri(options)
        self.storage_options = storage_options_from(options)
        self.cache_dir = options.get("cache_dir") or None
        self.overwrite = overwrite
        self.job_id = uuid.uuid4().hex
        self.skip = prepare_store(self.uri, self.storage_options, options, overwrite).skip
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

        if self.skip:  # saveMode=ignore and the store exists: nothing is written
            return _Files([])
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
        if self.skip:
            return
        if self.overwrite:  # an empty DataFrame too: it tombstones every key
            target = OverwriteTarget(self.uri, self.storage_options, driver_cache_dir(self.uri, self.cache_dir),
                                     self.partitions, self.compression, self.job_id)
            commit_overwrite(target, files)
            return
        if not files:
            return
        the_log = open_log(self.uri, create=False, storage_options=self.storage_options,
                           cache_dir=driver_cache_dir(self.uri, self.cache_dir), maintain_index=False)
        try:
            outcome = commit_files(the_log, "append", files)
        finally:
            the_log.close()
        if outcome.refusal is not None:
            raise KvlogError(f"the append commit was refused: {outcome.refusal.message}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete the tasks' files, except any that is live.

        A commit whose fate was unknown (a storage error while it was written) may have made
        them live; the store is asked first, and when it cannot answer nothing is deleted
        (garbage collection takes the files that never became live).
        """
        paths = [json.loads(f)["path"] for m in messages if isinstance(m, _Files) for f in m.files]
        if not paths:
            return
        try:
            the_log = open_log(self.uri, create=False, read_only=True, storage_options=self.storage_options,
                               cache_dir=driver_cache_dir(self.uri, self.cache_dir), maintain_index=False)
        except KvlogError:
            return
        try:
            live = {entry.path for _id, entry in the_log.snapshot(lambda r: list(r.iter_files()))}
            for path in paths:
                if path not in live:
                    the_log.storage.delete(path)
        finally:
            the_log.close()


@dataclass
class _Files(WriterCommitMessage):
    files: list[str]


def _as_bytes(column: pa.Array) -> list[bytes | None]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [None if v is None else v.encode("utf-8") for v in column.to_pylist()]
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type) or pa.types.is_null(column.type):
        return column.to_pylist()  # type: ignore[no-any-return]
    raise InvalidRecordError(f"kvlog keys and values are binary or string columns, not {column.type}")
