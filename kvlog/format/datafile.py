"""Data files: Apache Arrow IPC files with one record batch per kvlog batch.

Columns ``key`` (binary, not null), ``value`` (binary, null = tombstone) and
``timestamp`` (int64 ms). The schema carries ``kvlog.format`` in its metadata: the data-file
format version. Version 1 (:data:`~kvlog.format.SCHEMA`) has those three columns; version 2
(``SCHEMA_EXPIRES``) adds ``expires`` (int64 ms since the epoch, null = never), written only
when a file holds a record with a time to live, so a file without one keeps version 1's bytes.
A batch's entry in the batch directory names the version of its file's schema
(:attr:`BatchLocation.schema`): a batch is read as that schema's message followed by the batch's
own message, and a version this code does not know is refused.
Any Arrow reader (pyarrow, DuckDB, Polars, Spark) reads the file whole; kvlog
reads one batch at a time through its byte range — the IPC message of that
batch — and verifies the CRC32C that the batch directory keeps for it.
Offsets are not in the file: they are assigned by the commit that makes the
batch live (see :mod:`kvlog.format.commit`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import xxhash

from kvlog.errors import CorruptDataError
from kvlog.format.checksum import crc32c
from kvlog.format.columns import (
    binary_column,
    binary_ends,
    int64_column,
    nullable_int64_column,
    valid_mask,
)
from kvlog.format.envelope import FORMAT_VERSION
from kvlog.memory import ARROW_POOL

__all__ = [
    "DATAFILE_VERSION",
    "EXPIRES_VERSION",
    "SCHEMA",
    "SCHEMA_EXPIRES",
    "BatchLocation",
    "schema_version_of",
    "DataFileWriter",
    "decode_batch",
    "read_data_file",
    "make_record_batch",
    "batch_expires",
    "content_digest",
    "expires_column",
    "with_schema",
]

SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("timestamp", pa.int64(), nullable=False),
    ],
    metadata={"kvlog.format": str(FORMAT_VERSION)},
)

#: The data-file format version of :data:`~kvlog.format.SCHEMA` (no record with an expiry).
DATAFILE_VERSION = FORMAT_VERSION
#: The data-file format version of ``SCHEMA_EXPIRES``: version 1 plus the ``expires`` column.
EXPIRES_VERSION = 2

SCHEMA_EXPIRES = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("expires", pa.int64(), nullable=True),
    ],
    metadata={"kvlog.format": str(EXPIRES_VERSION)},
)
_SCHEMAS = {DATAFILE_VERSION: SCHEMA, EXPIRES_VERSION: SCHEMA_EXPIRES}

_MAGIC = b"ARROW1\x00\x00"
_CONTINUATION = b"\xff\xff\xff\xff"
#: Each schema as an IPC stream's first message: a stored batch message after it is a whole stream.
_SCHEMA_MESSAGES = {version: schema.serialize().to_pybytes() for version, schema in _SCHEMAS.items()}
_SCHEMA_MESSAGE = _SCHEMA_MESSAGES[DATAFILE_VERSION]


def schema_version_of(name: str, schema: pa.Schema) -> int:
    """The data-file format version a whole file's ``schema`` declares, checked against the
    columns of that version; ``CorruptDataError`` naming ``name`` for any other."""
    declared = (schema.metadata or {}).get(b"kvlog.format", b"").decode("utf-8", "replace")
    version = int(declared) if declared.isdigit() else -1
    expected = _SCHEMAS.get(version)
    if expected is None:
        raise CorruptDataError(name, f"unknown data-file format version {declared!r}")
    if not schema.equals(expected, check_metadata=False):
        raise CorruptDataError(name, f"the columns do not match data-file format version {version}")
    return version
#: Buffers are compressed and decompressed by the calling thread, not Arrow's CPU pool: memory
#: the pool's threads allocate stays in their allocator heaps, which nothing asks to give it
#: back (see kvlog.memory), while the caller's is released after each flush and compaction step.
_READ_OPTIONS = ipc.IpcReadOptions(use_threads=False)
#: As :data:`_READ_OPTIONS`, decoding the ``key`` column alone (its buffers only are decompressed).
_KEYS_ONLY_OPTIONS = ipc.IpcReadOptions(use_threads=False, included_fields=[0])


class _StreamOfMessage:
    """A read-only file of the schema message followed by one stored batch message.

    The stream reader is the reader that takes read options; it reads through this object,
    which hands out slices of the two parts, so the batch's bytes are never copied.
    """

    closed = False

    def __init__(self, batch_message: bytes | bytearray | memoryview, schema_message: bytes = _SCHEMA_MESSAGE) -> None:
        self._parts = [memoryview(schema_message), memoryview(batch_message).cast("B")]
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        self.closed = True

    def read(self, size: int = -1) -> memoryview | bytes:
        parts = self._parts
        while parts and not len(parts[0]):
            parts.pop(0)
        if not parts:
            return b""
        head = parts[0]
        if size < 0 or size >= len(head):
            out = parts.pop(0)
        else:
            out, parts[0] = head[:size], head[size:]
        self._position += len(out)
        return out


@dataclass(frozen=True)
class BatchLocation:
    """Where one batch's IPC message lies in its data file, and its checksum."""

    position: int
    length: int
    crc: int
    count: int
    data_bytes: int
    """Key plus value bytes of the batch, uncompressed (the unit of the dirty ratio)."""
    min_timestamp: int
    max_timestamp: int
    schema: int = DATAFILE_VERSION
    """The data-file format version of the file's schema (``EXPIRES_VERSION``: it has the
    ``expires`` column)."""


def expires_column(expires: Sequence[int | None]) -> pa.Array:
    """A nullable int64 array of expiry times (None: never)."""
    valid = np.fromiter((e is not None for e in expires), dtype=bool, count=len(expires))
    stamps = np.fromiter((0 if e is None else e for e in expires), dtype=np.int64, count=len(expires))
    return nullable_int64_column(stamps, valid)


def make_record_batch(
    keys: Sequence[bytes], values: Sequence[bytes | None], timestamps: Sequence[int],
    expires: Sequence[int | None] | None = None,
) -> pa.RecordBatch:
    """A record batch of the data-file schema from Python sequences: :data:`~kvlog.format.SCHEMA`, or
    ``SCHEMA_EXPIRES`` when ``expires`` (one expiry or None per record) holds one."""
    stamps = np.fromiter(timestamps, dtype=np.int64, count=len(timestamps))
    columns = [binary_column(keys), binary_column(values), int64_column(stamps)]
    if expires is not None and any(e is not None for e in expires):
        return pa.record_batch([*columns, expires_column(expires)], schema=SCHEMA_EXPIRES)
    return pa.record_batch(columns, schema=SCHEMA)


def batch_expires(batch: pa.RecordBatch) -> pa.Array | None:
    """The ``expires`` column of a record batch, or None when it has none (or holds only nulls)."""
    if batch.num_columns < 4:
        return None
    column = batch.column(3)
    return None if column.null_count == len(column) else column


def with_schema(batch: pa.RecordBatch, version: int) -> pa.RecordBatch:
    """``batch`` with the columns of data-file format ``version``: a batch without expiries
    gains a null ``expires`` column, or loses one holding only nulls (``ValueError`` if it
    holds an expiry and ``version`` has no column for it)."""
    schema = _SCHEMAS[version]
    columns = batch.columns[:3]
    if version == EXPIRES_VERSION:
        expires = batch.column(3) if batch.num_columns > 3 else pa.nulls(batch.num_rows, pa.int64())
        return pa.record_batch([*columns, expires], schema=schema)
    if batch_expires(batch) is not None:
        raise ValueError("a batch with expiries needs data-file format version 2")
    return pa.record_batch(columns, schema=schema)


def content_digest(records: pa.RecordBatch) -> int:
    """A 63-bit XXH3 digest of a batch's keys and values (not its timestamps).

    It tells a producer's resend of a batch (the same records, possibly stamped later) from
    another batch that happens to carry the same producer sequences. It depends only on the
    records' bytes: the lengths and bytes of each key and value and which values are null.
    """
    h = xxhash.xxh3_64()
    for i in (0, 1):
        column = records.column(i)
        ends, data = binary_ends(column)
        first, last = int(ends[0]), int(ends[-1])
        h.update((ends - ends[0]).astype("<i8").tobytes())
        h.update(memoryview(data)[first:last])
        if i == 1:
            # One byte per value, 1 where it is null: read from the validity bitmap (an Arrow
            # compute call costs more than the whole digest of a small batch).
            h.update(bytes(len(column)) if column.null_count == 0
                     else (~valid_mask(column)).astype(np.uint8).tobytes())
    return h.intdigest() >> 1


def _binary_bytes(column: pa.Array) -> int:
    """The bytes of a binary column's non-null values (from its offsets when it has no null)."""
    if column.null_count == 0:
        ends, _data = binary_ends(column)
        return int(ends[-1]) - int(ends[0])
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)


def _int64_range(column: pa.Array) -> tuple[Any, Any]:
    """The least and greatest value of a non-empty int64 column (as Arrow's ``min`` and ``max``
    give them: None for a column of nulls)."""
    if column.null_count == 0 and column.type == pa.int64():
        values = np.frombuffer(column.buffers()[1], dtype=np.int64, count=len(column), offset=8 * column.offset)
        return int(values.min()), int(values.max())
    return pc.min(column).as_py(), pc.max(column).as_py()


class DataFileWriter:
    """Builds one data file batch by batch, in memory or in a local spill file."""

    def __init__(self, compression: str = "zstd", spill_path: Path | None = None, *,
                 expires: bool = False) -> None:
        """With ``spill_path`` the file is written there and :meth:`finish_view` maps it, so it
        never takes process memory; :meth:`close` then deletes it. With ``expires`` the file has
        ``SCHEMA_EXPIRES`` (any batch may hold expiring records), else :data:`~kvlog.format.SCHEMA`."""
        self._spill_path = spill_path
        self.schema_version = EXPIRES_VERSION if expires else DATAFILE_VERSION
        self._schema = _SCHEMAS[self.schema_version]
        self._sink: pa.NativeFile = (
            pa.BufferOutputStream() if spill_path is None else pa.OSFile(str(spill_path), "wb")
        )
        self._mapped: pa.MemoryMappedFile | None = None
        codec = None if compression == "none" else compression
        self._writer = ipc.new_file(
            self._sink, self._schema, options=ipc.IpcWriteOptions(compression=codec, use_threads=False)
        )
        self._spans: list[tuple[int, int, int, int, int, int]] = []
        self._finished = False

    def add(self, batch: pa.RecordBatch) -> int:
        """Append ``batch`` (of either data-file schema, at least one row); returns its index in
        the file. ``ValueError`` for a batch with expiries in a file without the column."""
        if batch.num_rows == 0:
            raise ValueError("a data-file batch holds at least one record")
        if not batch.schema.equals(self._schema, check_metadata=False):
            batch = with_schema(batch, self.schema_version)
        start = self._sink.tell()
        self._writer.write_batch(batch)
        key_bytes = _binary_bytes(batch.column(0))
        value_bytes = _binary_bytes(batch.column(1))
        lo, hi = _int64_range(batch.column(2))
        self._spans.append((start, self._sink.tell(), batch.num_rows, key_bytes + value_bytes, lo, hi))
        return len(self._spans) - 1

    def finish(self) -> tuple[bytes, list[BatchLocation]]:
        """The file's bytes and the location of every batch, in the order they were added."""
        view, locations = self.finish_view()
        return view.tobytes(), locations

    def finish_view(self) -> tuple[memoryview, list[BatchLocation]]:
        """As :meth:`finish`, but the bytes are a read-only view of the writer's own buffer (no copy)."""
        if self._finished:
            raise ValueError("data file already finished")
        self._finished = True
        self._writer.close()
        if self._spill_path is None:
            assert isinstance(self._sink, pa.BufferOutputStream)
            data = memoryview(self._sink.getvalue()).cast("B").toreadonly()
        else:
            self._sink.close()
            self._mapped = pa.memory_map(str(self._spill_path), "r")
            data = memoryview(self._mapped.read_buffer()).cast("B").toreadonly()
        first_batch = _first_message_end(data)
        locations = []
        for index, (start, end, count, nbytes, lo, hi) in enumerate(self._spans):
            # The writer emits the schema lazily with the first batch.
            begin = first_batch if index == 0 else start
            locations.append(
                BatchLocation(begin, end - begin, crc32c(memoryview(data)[begin:end]), count, nbytes, lo, hi,
                              self.schema_version)
            )
        return data, locations


    @property
    def spill_path(self) -> Path | None:
        """The local file the data file is built in, if any (after :meth:`finish_view` it holds
        the whole file; :meth:`close` deletes it if it is still there)."""
        return self._spill_path

    def close(self) -> None:
        """Release the spill file (if any): unmap and delete it."""
        if self._spill_path is None:
            return
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None
        if not self._sink.closed:
            self._sink.close()
        self._spill_path.unlink(missing_ok=True)


def _first_message_end(data: bytes | memoryview) -> int:
    """Offset just past the schema message that follows the file magic."""
    if data[:8] != _MAGIC or data[8:12] != _CONTINUATION:
        raise ValueError("not an Arrow IPC file")
    (length,) = struct.unpack_from("<i", data, 12)
    return 16 + int(length)


def decode_batch(name: str, data: bytes | bytearray | memoryview, location: BatchLocation, *,
                 keys_only: bool = False, memory_pool: pa.MemoryPool = ARROW_POOL) -> pa.RecordBatch:
    """The record batch stored at ``location``, from exactly its bytes; verified.

    With ``keys_only`` the batch holds the ``key`` column alone: the whole message is still
    checksummed, but only the key buffers are decompressed.
    """
    if len(data) != location.length:
        raise CorruptDataError(
            name, f"batch at byte {location.position} truncated: {len(data)} of {location.length} bytes"
        )
    if crc32c(data) != location.crc:
        raise CorruptDataError(name, f"checksum mismatch in the batch at byte {location.position}")
    schema_message = _SCHEMA_MESSAGES.get(location.schema)
    if schema_message is None:
        raise CorruptDataError(name, f"unknown data-file format version {location.schema}")
    try:
        options = _KEYS_ONLY_OPTIONS if keys_only else _READ_OPTIONS
        stream = _StreamOfMessage(data, schema_message)
        batch = ipc.open_stream(stream, options=options, memory_pool=memory_pool).read_next_batch()
        # Damage that matched the checksum must not reach a reader as offsets outside the data
        # (about 3% of the decode's time: the offsets are checked, not the bytes).
        batch.validate(full=True)
    # StopIteration: a message that holds no batch.
    except (pa.ArrowInvalid, pa.ArrowException, OSError, StopIteration) as e:  # pragma: no cover - CRC first
        raise CorruptDataError(name, f"undecodable batch at byte {location.position} ({e})") from None
    if batch.num_rows != location.count:
        raise CorruptDataError(
            name, f"batch at byte {location.position} has {batch.num_rows} records, expected {location.count}"
        )
    return batch


def read_data_file(
    name: str, data: bytes, locations: Sequence[BatchLocation], *, size: int | None = None,
    crc: int | None = None,
) -> list[pa.RecordBatch]:
    """Every batch of a whole data file, verified against its directory (and file size and CRC)."""
    if size is not None and len(data) != size:
        raise CorruptDataError(name, f"size {len(data)} bytes, expected {size}")
    if crc is not None and crc32c(data) != crc:
        raise CorruptDataError(name, "file checksum mismatch")
    view = memoryview(data)
    return [decode_batch(name, view[loc.position : loc.position + loc.length], loc) for loc in locations]
