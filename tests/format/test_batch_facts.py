"""What a data file's writer and the producer rules compute of a batch without Arrow compute:
a batch's content digest, its key and value bytes and its timestamp range, checked against
Arrow compute on every shape a batch takes (nulls, slices of a flush's column, null slots
holding bytes)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.format import SCHEMA, DataFileWriter, make_record_batch
from kvlog.format.columns import binary_ends
from kvlog.format.datafile import content_digest

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

rows_st = st.lists(
    st.tuples(st.binary(max_size=12), st.none() | st.binary(max_size=20), st.integers(INT64_MIN, INT64_MAX)),
    min_size=1, max_size=16,
)


def digest_by_compute(records: pa.RecordBatch) -> int:
    """The content digest as Arrow compute states it (the nulls from ``is_null``)."""
    h = xxhash.xxh3_64()
    for i in (0, 1):
        column = records.column(i)
        ends, data = binary_ends(column)
        h.update((ends - ends[0]).astype("<i8").tobytes())
        h.update(memoryview(data)[int(ends[0]):int(ends[-1])])
        if i == 1:
            h.update(np.asarray(column.is_null(), dtype=np.uint8).tobytes())
    return h.intdigest() >> 1


def slices(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    n = batch.num_rows
    return [batch] + [batch.slice(a, b - a) for a in range(n) for b in range(a + 1, n + 1) if (a, b) != (0, n)][:12]


@settings(max_examples=60, deadline=None)
@given(rows=rows_st)
def test_the_digest_and_the_batch_facts_agree_with_arrow_compute(rows: list[tuple[bytes, bytes | None, int]]) -> None:
    keys, values, stamps = zip(*rows, strict=True)
    for batch in slices(make_record_batch(keys, values, stamps)):
        assert content_digest(batch) == digest_by_compute(batch)
        writer = DataFileWriter("none")
        writer.add(batch)
        _data, (loc,) = writer.finish()
        expected_bytes = sum(pc.sum(pc.binary_length(batch.column(i))).as_py() or 0 for i in (0, 1))
        assert loc.data_bytes == expected_bytes
        assert (loc.min_timestamp, loc.max_timestamp) == (pc.min(batch.column(2)).as_py(),
                                                          pc.max(batch.column(2)).as_py())


def test_null_values_holding_bytes_count_as_nulls() -> None:
    # Arrow lets a null slot span bytes; they are neither a value's bytes nor digested as one.
    offsets = np.array([0, 3, 7, 9], dtype=np.int32)
    values = pa.Array.from_buffers(pa.binary(), 3, [pa.py_buffer(np.packbits([1, 0, 1], bitorder="little")),
                                                     pa.py_buffer(offsets), pa.py_buffer(b"abcdefghi")],
                                   null_count=1)
    batch = pa.record_batch([pa.array([b"k1", b"k2", b"k3"]), values, pa.array([5, -1, 3], pa.int64())],
                            schema=SCHEMA)
    assert content_digest(batch) == digest_by_compute(batch)
    writer = DataFileWriter("none")
    writer.add(batch)
    _data, (loc,) = writer.finish()
    assert loc.data_bytes == 6 + 3 + 2
    assert (loc.min_timestamp, loc.max_timestamp) == (-1, 5)


def test_the_digest_of_known_records_is_stable() -> None:
    # Digests are stored in commits and producer windows: they may never change.
    batch = make_record_batch([b"a", b"bc", b"", b"key"], [b"x", None, b"", b"value"], [1, 2, 3, 4])
    assert content_digest(batch) == 5460900521439180891
    assert content_digest(batch.slice(1, 2)) == 5426281045389389606
