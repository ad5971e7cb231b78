"""Data-file format 2 (the ``expires`` column) next to format 1, and a store written before it.

``fixtures/store_v1`` is a store written by kvlog before records could expire (format 1 files,
commits whose batches carry no ``schema`` field); it must open and read as it did.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import kvlog
from kvlog.errors import CorruptDataError
from kvlog.format.commit import BatchEntry, FileEntry, file_from_json, file_to_json
from kvlog.format.datafile import (
    DATAFILE_VERSION,
    EXPIRES_VERSION,
    SCHEMA,
    SCHEMA_EXPIRES,
    DataFileWriter,
    decode_batch,
    make_record_batch,
    schema_version_of,
    with_schema,
)
from kvlog.meta.records import LiveBatch

FIXTURE = Path(__file__).parent / "fixtures" / "store_v1"
NAME = "data/0/f.arrow"

#: The format 1 schema as it has always been written, spelled out here, not imported.
LEGACY = pa.schema(
    [pa.field("key", pa.binary(), nullable=False), pa.field("value", pa.binary(), nullable=True),
     pa.field("timestamp", pa.int64(), nullable=False)],
    metadata={"kvlog.format": "1"},
)


def test_records_without_expiry_keep_format_1_bytes() -> None:
    assert SCHEMA.equals(LEGACY, check_metadata=True)
    batch = make_record_batch([b"k"], [b"v"], [1], [None])
    assert batch.schema.equals(LEGACY, check_metadata=True)
    writer = DataFileWriter("none")
    writer.add(batch)
    data, [location] = writer.finish()
    assert location.schema == DATAFILE_VERSION
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, LEGACY, options=ipc.IpcWriteOptions(compression=None)) as legacy:
        legacy.write_batch(pa.record_batch(batch.columns, schema=LEGACY))
    assert data == sink.getvalue().to_pybytes()
    assert "schema" not in json.dumps(file_to_json(FileEntry("f", NAME, 0, len(data), 0, (BatchEntry(0, location),))))


def test_a_file_with_expiries_is_format_2_and_reads_back() -> None:
    writer = DataFileWriter("zstd", expires=True)
    writer.add(make_record_batch([b"a", b"b"], [b"1", None], [5, 6], [100, None]))
    writer.add(make_record_batch([b"c"], [b"3"], [7]))  # a batch without expiries gains the column
    data, locations = writer.finish()
    assert [loc.schema for loc in locations] == [EXPIRES_VERSION, EXPIRES_VERSION]
    reader = ipc.open_file(pa.py_buffer(data))
    assert schema_version_of(NAME, reader.schema) == EXPIRES_VERSION
    assert reader.schema.equals(SCHEMA_EXPIRES, check_metadata=True)
    first = decode_batch(NAME, memoryview(data)[locations[0].position:][:locations[0].length], locations[0])
    assert first.column(3).to_pylist() == [100, None]
    second = decode_batch(NAME, memoryview(data)[locations[1].position:][:locations[1].length], locations[1])
    assert second.column(3).to_pylist() == [None]
    entry = FileEntry("f", NAME, 0, len(data), 0, tuple(BatchEntry(0, loc) for loc in locations))
    assert file_from_json(NAME, json.loads(json.dumps(file_to_json(entry)))) == entry


def test_a_batch_with_expiries_never_enters_a_format_1_file() -> None:
    writer = DataFileWriter("none")
    with pytest.raises(ValueError):
        writer.add(make_record_batch([b"a"], [b"1"], [5], [100]))
    assert with_schema(make_record_batch([b"a"], [b"1"], [5], [None]), DATAFILE_VERSION).schema.equals(SCHEMA)


@pytest.mark.parametrize("version", [0, 3, 99])
def test_an_unknown_format_version_is_refused(version: int) -> None:
    writer = DataFileWriter("none", expires=True)
    writer.add(make_record_batch([b"a"], [b"1"], [5], [100]))
    data, [location] = writer.finish()
    view = memoryview(data)[location.position:][:location.length]
    with pytest.raises(CorruptDataError, match="unknown data-file format version"):
        decode_batch(NAME, view, replace(location, schema=version))
    schema = SCHEMA_EXPIRES.with_metadata({"kvlog.format": str(version)})
    with pytest.raises(CorruptDataError, match="unknown data-file format version"):
        schema_version_of(NAME, schema)
    with pytest.raises(CorruptDataError, match="do not match"):
        schema_version_of(NAME, SCHEMA.with_metadata({"kvlog.format": "2"}))


def test_batch_directory_json_without_schema_reads_as_format_1() -> None:
    batch = LiveBatch("f", NAME, 0, 0, 16, 100, 7, 1, 2, 5, 5, 0, 0)
    encoded = batch.to_json()
    assert "schema" not in encoded and LiveBatch.from_json(encoded).schema == DATAFILE_VERSION
    newer = replace(batch, schema=EXPIRES_VERSION)
    assert newer.to_json()["schema"] == 2 and LiveBatch.from_json(newer.to_json()) == newer
    assert newer.location.schema == EXPIRES_VERSION


def test_a_store_written_before_expiries_opens_reads_and_takes_them(tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    clock = kvlog.ManualClock()
    store = kvlog.open(root, cache_dir=tmp_path / "cache", clock=clock, flush_interval_ms=0,
                       background_compaction=False)
    assert dict(store.scan()) == {b"a": b"2", b"b": b"x" * 2000}
    assert len(store) == 2 and store.get(b"c") is None
    assert all(r.expires_ms is None for r in store.changes())
    store.put(b"a", b"3", ttl_ms=50, sync=True)
    store.compact(force=True)
    assert store.check() == []
    clock.advance(50)
    assert dict(store.scan()) == {b"b": b"x" * 2000}
    store.close()
    old_files = sorted(p.relative_to(FIXTURE) for p in FIXTURE.rglob("*.arrow"))
    for path in old_files:
        reader = ipc.open_file(pa.OSFile(str(root / path)))
        assert schema_version_of(str(path), reader.schema) == DATAFILE_VERSION
