"""Data files: Arrow IPC with one verified byte range per kvlog batch."""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.errors import CorruptDataError
from kvlog.format import (
    SCHEMA,
    BatchLocation,
    DataFileWriter,
    crc32c,
    decode_batch,
    make_record_batch,
    read_data_file,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
COMPRESSIONS = ["zstd", "lz4", "none"]
NAME = "data/0/0123456789abcdef.arrow"

Row = tuple[bytes, bytes | None, int]

rows_st = st.lists(
    st.tuples(
        st.binary(max_size=24),
        st.none() | st.binary(max_size=48),
        st.integers(INT64_MIN, INT64_MAX),
    ),
    min_size=1,
    max_size=12,
)
batches_st = st.lists(rows_st, min_size=1, max_size=4)
names_st = st.text(min_size=1, max_size=40)
masks_st = st.integers(1, 255)


def write_file(batches: list[list[Row]], compression: str) -> tuple[bytes, list[BatchLocation]]:
    writer = DataFileWriter(compression)
    for index, rows in enumerate(batches):
        keys, values, timestamps = zip(*rows, strict=True)
        assert writer.add(make_record_batch(keys, values, timestamps)) == index
    return writer.finish()


def as_rows(batch: pa.RecordBatch) -> list[Row]:
    return [(r["key"], r["value"], r["timestamp"]) for r in batch.to_pylist()]


def batch_bytes(data: bytes, loc: BatchLocation) -> bytes:
    return data[loc.position : loc.position + loc.length]


def flipped(data: bytes, index: int, mask: int) -> bytes:
    out = bytearray(data)
    out[index] ^= mask
    return bytes(out)


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=30, deadline=None)
@given(batches=batches_st)
def test_batches_round_trip(compression: str, batches: list[list[Row]]) -> None:
    data, locations = write_file(batches, compression)
    assert len(locations) == len(batches)
    for rows, loc in zip(batches, locations, strict=True):
        assert loc.count == len(rows)
        assert loc.min_timestamp == min(ts for _, _, ts in rows)
        assert loc.max_timestamp == max(ts for _, _, ts in rows)
        assert loc.crc == crc32c(batch_bytes(data, loc))
        assert loc.data_bytes >= sum(len(k) + len(v or b"") for k, v, _ in rows)
        assert as_rows(decode_batch(NAME, batch_bytes(data, loc), loc)) == rows
        # A memoryview slice of the file works as well as bytes.
        view = memoryview(data)[loc.position : loc.position + loc.length]
        assert as_rows(decode_batch(NAME, view, loc)) == rows
    whole = read_data_file(NAME, data, locations, size=len(data), crc=crc32c(data))
    assert [as_rows(b) for b in whole] == batches
    assert [as_rows(b) for b in read_data_file(NAME, data, locations)] == batches


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=15, deadline=None)
@given(batches=batches_st)
def test_batch_ranges_follow_the_schema_message_and_tile_the_batches(
    compression: str, batches: list[list[Row]]
) -> None:
    data, locations = write_file(batches, compression)
    assert data[:8] == b"ARROW1\x00\x00"
    assert data[8:12] == b"\xff\xff\xff\xff"
    (schema_length,) = struct.unpack_from("<i", data, 12)
    assert locations[0].position == 16 + schema_length
    for before, after in zip(locations, locations[1:], strict=False):
        assert after.position == before.position + before.length
    # Each range is exactly one IPC message: the record batch.
    for loc in locations:
        message = ipc.read_message(pa.py_buffer(batch_bytes(data, loc)))
        assert message.type == "record batch"
    assert locations[-1].position + locations[-1].length < len(data)  # the footer follows


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=15, deadline=None)
@given(batches=batches_st)
def test_plain_pyarrow_reads_the_file(compression: str, batches: list[list[Row]]) -> None:
    data, _ = write_file(batches, compression)
    reader = ipc.open_file(pa.py_buffer(data))
    assert reader.schema.metadata == {b"kvlog.format": b"1"}
    assert reader.schema.equals(SCHEMA, check_metadata=True)
    assert reader.num_record_batches == len(batches)
    assert [as_rows(reader.get_batch(i)) for i in range(reader.num_record_batches)] == batches
    table = reader.read_all()
    assert table.column_names == ["key", "value", "timestamp"]
    assert [(r["key"], r["value"], r["timestamp"]) for r in table.to_pylist()] == [
        row for rows in batches for row in rows
    ]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_extreme_values(compression: str) -> None:
    rows: list[Row] = [
        (b"", b"", INT64_MIN),
        (b"\x00\xff" * 300, None, INT64_MAX),
        (b"k", b"\x00" * 70_000, -1),
        (b"k", None, 0),
    ]
    data, [loc] = write_file([rows], compression)
    assert (loc.min_timestamp, loc.max_timestamp) == (INT64_MIN, INT64_MAX)
    batch = decode_batch(NAME, batch_bytes(data, loc), loc)
    assert as_rows(batch) == rows
    assert batch.column(1).null_count == 2


def test_a_file_without_batches_is_a_valid_arrow_file() -> None:
    data, locations = DataFileWriter().finish()
    assert locations == []
    assert ipc.open_file(pa.py_buffer(data)).num_record_batches == 0
    assert read_data_file(NAME, data, [], size=len(data), crc=crc32c(data)) == []


def test_a_batch_with_another_schema_metadata_is_stored_with_the_kvlog_schema() -> None:
    plain = pa.record_batch(
        [pa.array([b"k"], pa.binary()), pa.array([None], pa.binary()), pa.array([7], pa.int64())],
        names=["key", "value", "timestamp"],
    )
    writer = DataFileWriter("none")
    writer.add(plain)
    data, [loc] = writer.finish()
    assert as_rows(decode_batch(NAME, batch_bytes(data, loc), loc)) == [(b"k", None, 7)]
    assert ipc.open_file(pa.py_buffer(data)).schema.metadata == {b"kvlog.format": b"1"}


def test_writer_refuses_empty_batches_and_a_second_finish() -> None:
    writer = DataFileWriter()
    with pytest.raises(ValueError):
        writer.add(make_record_batch([], [], []))
    writer.add(make_record_batch([b"a"], [b"b"], [1]))
    writer.finish()
    with pytest.raises(ValueError):
        writer.finish()


# --- corruption ---------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=10, deadline=None)
@given(batches=batches_st, mask=masks_st, name=names_st)
def test_any_flipped_byte_in_a_batch_is_detected(
    compression: str, batches: list[list[Row]], mask: int, name: str
) -> None:
    data, locations = write_file(batches, compression)
    for loc in locations:
        good = batch_bytes(data, loc)
        for index in range(len(good)):
            with pytest.raises(CorruptDataError) as caught:
                decode_batch(name, flipped(good, index, mask), loc)
            assert caught.value.name == name


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=10, deadline=None)
@given(batches=batches_st, name=names_st)
def test_any_truncated_batch_is_detected(
    compression: str, batches: list[list[Row]], name: str
) -> None:
    data, locations = write_file(batches, compression)
    for loc in locations:
        good = batch_bytes(data, loc)
        for length in range(len(good)):
            with pytest.raises(CorruptDataError) as caught:
                decode_batch(name, good[:length], loc)
            assert caught.value.name == name
        # Bytes beyond the range are refused as well, never silently ignored.
        with pytest.raises(CorruptDataError):
            decode_batch(name, good + b"\x00", loc)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=8, deadline=None)
@given(batches=batches_st, mask=masks_st, name=names_st)
def test_any_flipped_byte_of_a_verified_file_is_detected(
    compression: str, batches: list[list[Row]], mask: int, name: str
) -> None:
    data, locations = write_file(batches, compression)
    size, crc = len(data), crc32c(data)
    for index in range(len(data)):
        with pytest.raises(CorruptDataError) as caught:
            read_data_file(name, flipped(data, index, mask), locations, size=size, crc=crc)
        assert caught.value.name == name


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=8, deadline=None)
@given(batches=batches_st, name=names_st)
def test_any_truncation_of_a_verified_file_is_detected(
    compression: str, batches: list[list[Row]], name: str
) -> None:
    data, locations = write_file(batches, compression)
    size, crc = len(data), crc32c(data)
    for length in range(len(data)):
        with pytest.raises(CorruptDataError) as caught:
            read_data_file(name, data[:length], locations, size=size, crc=crc)
        assert caught.value.name == name
    with pytest.raises(CorruptDataError):
        read_data_file(name, data + b"\x00", locations, size=size, crc=crc)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=10, deadline=None)
@given(batches=batches_st, mask=masks_st, picks=st.lists(st.integers(0, 2**32), min_size=1, max_size=6))
def test_without_file_checks_damage_gives_an_error_or_the_right_data_never_wrong_data(
    compression: str, batches: list[list[Row]], mask: int, picks: list[int]
) -> None:
    # Without size and CRC, bytes outside every batch range (schema, footer) are not
    # read by kvlog; damage there is harmless, damage inside a batch is an error.
    # Every byte inside the ranges is tried (the CRC refuses it before decoding);
    # outside them, where a read decodes every batch, a drawn sample is tried.
    data, locations = write_file(batches, compression)
    covered = [i for loc in locations for i in range(loc.position, loc.position + loc.length)]
    for index in covered:
        with pytest.raises(CorruptDataError) as caught:
            read_data_file(NAME, flipped(data, index, mask), locations)
        assert caught.value.name == NAME
    outside = sorted(set(range(len(data))) - set(covered))
    for pick in picks:
        damaged = flipped(data, outside[pick % len(outside)], mask)
        assert [as_rows(b) for b in read_data_file(NAME, damaged, locations)] == batches
    for pick in picks:
        length = pick % len(data)
        try:
            result = read_data_file(NAME, data[:length], locations)
        except CorruptDataError as e:
            assert e.name == NAME
            assert length < locations[-1].position + locations[-1].length
        else:
            assert [as_rows(b) for b in result] == batches


def test_a_directory_entry_that_disagrees_with_the_batch_is_refused() -> None:
    data, [loc] = write_file([[(b"a", b"1", 1), (b"b", None, 2)]], "zstd")
    good = batch_bytes(data, loc)
    wrong_count = BatchLocation(
        loc.position, loc.length, loc.crc, loc.count + 1, loc.data_bytes,
        loc.min_timestamp, loc.max_timestamp,
    )
    with pytest.raises(CorruptDataError, match="expected 3") as caught:
        decode_batch(NAME, good, wrong_count)
    assert caught.value.name == NAME
    wrong_crc = BatchLocation(
        loc.position, loc.length, loc.crc ^ 1, loc.count, loc.data_bytes,
        loc.min_timestamp, loc.max_timestamp,
    )
    with pytest.raises(CorruptDataError, match="checksum"):
        decode_batch(NAME, good, wrong_crc)
    beyond = BatchLocation(
        len(data) - 10, loc.length, loc.crc, loc.count, loc.data_bytes,
        loc.min_timestamp, loc.max_timestamp,
    )
    with pytest.raises(CorruptDataError, match="truncated"):
        read_data_file(NAME, data, [beyond])


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=30, deadline=None)
@given(batches=batches_st)
def test_decoding_keys_only_yields_the_key_column_of_the_whole_batch(compression: str,
                                                                      batches: list[list[Row]]) -> None:
    data, locations = write_file(batches, compression)
    for loc in locations:
        whole = decode_batch(NAME, batch_bytes(data, loc), loc)
        keys = decode_batch(NAME, batch_bytes(data, loc), loc, keys_only=True)
        assert keys.num_columns == 1 and keys.schema.names == ["key"]
        assert keys.column(0).equals(whole.column(0))


def test_decoding_keys_only_still_checks_the_whole_batch() -> None:
    data, [loc] = write_file([[(b"a", b"1", 1), (b"b", b"2", 2)]], "zstd")
    raw = batch_bytes(data, loc)
    with pytest.raises(CorruptDataError, match="checksum"):
        decode_batch(NAME, flipped(raw, len(raw) - 9, 0x01), loc, keys_only=True)
