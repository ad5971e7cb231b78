"""The compiled column loops: binary columns from bytes, index pairs from binary columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.format.columns import (
    INDEX_HEAD_BYTES,
    binary_column,
    binary_ends,
    bool_column,
    index_pairs,
    int64_column,
    valid_mask,
)
from kvlog.index.entry import encode_index_value

#: Each test runs against the C extensions and against their Python twins.
pytestmark = pytest.mark.usefixtures("native")

items_strategy = st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60)


@settings(deadline=None)
@given(items_strategy, st.randoms(use_true_random=False))
def test_binary_column_equals_arrow_conversion(items: list[bytes | None], rng) -> None:
    order_list = list(range(len(items))) * 2
    rng.shuffle(order_list)
    order = np.array(order_list[: len(items) + 3], dtype=np.int64) if items else None
    column = binary_column(items)
    column.validate(full=True)
    assert column.to_pylist() == items
    assert column.null_count == sum(item is None for item in items)
    if order is not None:
        taken = binary_column(items, order)
        taken.validate(full=True)
        assert taken.to_pylist() == [items[i] for i in order.tolist()]


def test_binary_column_other_items_take_arrows_conversion() -> None:
    assert binary_column([bytearray(b"a"), None, memoryview(b"bc")]).to_pylist() == [b"a", None, b"bc"]
    assert binary_column([b"a", bytearray(b"b")], np.array([1, 0], dtype=np.int64)).to_pylist() == [b"b", b"a"]
    with pytest.raises((TypeError, pa.ArrowException)):
        binary_column([b"a", 3])


def test_binary_column_rejects_positions_outside() -> None:
    with pytest.raises(IndexError):
        binary_column([b"a"], np.array([1], dtype=np.int64))
    with pytest.raises(IndexError):
        binary_column([b"a"], np.array([-1], dtype=np.int64))
    with pytest.raises(TypeError, match="int64"):
        binary_column([b"a"], np.array([0], dtype=np.int32))  # type: ignore[arg-type]


@settings(deadline=None)
@given(st.lists(st.booleans(), max_size=70))
def test_bool_column(mask: list[bool]) -> None:
    assert bool_column(np.array(mask, dtype=bool)).to_pylist() == mask


def test_binary_column_of_nothing() -> None:
    assert binary_column([]).to_pylist() == []
    assert binary_column([b"x"], np.array([], dtype=np.int64)).to_pylist() == []


def test_int64_column_shares_values() -> None:
    values = np.array([3, -1, 2**40], dtype=np.int64)
    assert int64_column(values).to_pylist() == [3, -1, 2**40]


def _expected_value(key: bytes, partition: int, offset: int, value: bytes, limit: int) -> bytes:
    return encode_index_value(key, partition, offset, value if len(value) <= limit else None)


@settings(deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=30)), min_size=1, max_size=40),
       st.integers(0, 3), st.integers(0, 30), st.data())
def test_index_pairs_match_the_head_layout(records: list[tuple[bytes, bytes]], start: int, limit: int,
                                           data: st.DataObject) -> None:
    keys = pa.array([k for k, _ in records], type=pa.binary())
    values = pa.array([v for _, v in records], type=pa.binary())
    start = min(start, len(records) - 1)
    keys, values = keys.slice(start), values.slice(start)  # a slice: offsets not starting at 0
    n = len(keys)
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=10)), dtype=np.int64)
    partitions = np.array([data.draw(st.integers(0, 65535)) for _ in rows], dtype=np.uint16)
    positions = np.array([data.draw(st.integers(0, 2**63 - 1)) for _ in rows], dtype=np.int64)
    pairs = index_pairs(keys, values, rows, partitions, positions, limit)
    key_list, value_list = keys.to_pylist(), values.to_pylist()
    assert pairs == [
        (key_list[r], _expected_value(key_list[r], int(p), int(o), value_list[r], limit))
        for r, p, o in zip(rows.tolist(), partitions.tolist(), positions.tolist(), strict=True)
    ]
    assert all(len(v) >= INDEX_HEAD_BYTES for _, v in pairs)


def test_index_pairs_reject_rows_outside_and_mismatched_lengths() -> None:
    keys = pa.array([b"a", b"b"], type=pa.binary())
    values = pa.array([b"1", b"2"], type=pa.binary())
    one = np.zeros(1, dtype=np.uint16)
    with pytest.raises(ValueError, match="outside"):
        index_pairs(keys, values, np.array([2], dtype=np.int64), one, np.zeros(1, dtype=np.int64), 8)
    with pytest.raises(ValueError, match="one entry per pair"):
        index_pairs(keys, values, np.array([0, 1], dtype=np.int64), one, np.zeros(2, dtype=np.int64), 8)
    with pytest.raises(ValueError, match="different lengths"):
        index_pairs(keys, values.slice(1), np.array([0], dtype=np.int64), one, np.zeros(1, dtype=np.int64), 8)


def test_binary_ends_apply_the_slice() -> None:
    array = pa.array([b"ab", b"c", b"def"], type=pa.binary()).slice(1)
    ends, data = binary_ends(array)
    assert ends.tolist() == [2, 3, 6]
    assert data.to_pybytes()[ends[0]:ends[-1]] == b"cdef"


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=3)), max_size=40), st.integers(0, 20))
def test_valid_mask_follows_the_slice(items: list[bytes | None], start: int) -> None:
    array = pa.array(items, type=pa.binary()).slice(min(start, len(items)))
    assert valid_mask(array).tolist() == [item is not None for item in array.to_pylist()]
