"""latest_rows: each distinct key's last row, in bytes order, against a dict-and-sorted model."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.format.columns import latest_rows

#: Each test runs against the C extensions and against their Python twins.
pytestmark = pytest.mark.usefixtures("native")


def model(keys: list[bytes]) -> list[int]:
    last = {key: row for row, key in enumerate(keys)}
    return [last[key] for key in sorted(last)]


def keys_sharing(prefix: bytes, tails: st.SearchStrategy[bytes]) -> st.SearchStrategy[list[bytes]]:
    return st.lists(tails.map(lambda tail: prefix + tail), max_size=300)


# Few distinct bytes make ties of the 8 sorting bytes (equal prefixes of different keys, zero
# padding against real zeros, one key a prefix of another) and repeated keys common.
narrow_bytes = st.binary(max_size=20).map(lambda b: bytes(x % 3 for x in b))
key_lists = st.one_of(
    st.lists(st.binary(max_size=24), max_size=300),
    st.lists(narrow_bytes, max_size=300),
    keys_sharing(b"user:0000", narrow_bytes),
    st.lists(st.binary(min_size=16, max_size=16), max_size=300),
    st.lists(st.sampled_from([b"a", b"a\x00", b"a\x00\x00", b"ab", b"b", b"", b"\x00"]), max_size=50),
)


@settings(deadline=None, max_examples=300)
@given(key_lists)
def test_latest_rows_matches_the_model(keys: list[bytes]) -> None:
    rows = latest_rows(pa.array(keys, type=pa.binary()))
    assert rows.dtype == np.int64
    assert rows.tolist() == model(keys)


@settings(deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=100), st.data())
def test_a_slice_of_a_column(keys: list[bytes], data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(keys)))
    stop = data.draw(st.integers(start, len(keys)))
    column = pa.array(keys, type=pa.binary()).slice(start, stop - start)
    assert latest_rows(column).tolist() == model(keys[start:stop])


def test_many_random_keys_with_updates() -> None:
    rng = np.random.default_rng(5)
    distinct = [bytes(k) for k in rng.integers(0, 256, size=(20_000, 16), dtype=np.uint8)]
    keys = [distinct[i] for i in rng.integers(0, len(distinct), size=60_000)]
    assert latest_rows(pa.array(keys, type=pa.binary())).tolist() == model(keys)


def test_empty_and_null_columns() -> None:
    assert latest_rows(pa.array([], type=pa.binary())).tolist() == []
    with pytest.raises(ValueError, match="null"):
        latest_rows(pa.array([b"a", None], type=pa.binary()))
