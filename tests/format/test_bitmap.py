"""Present offsets of compacted batches: portable roaring bitmaps in base64."""

from __future__ import annotations

import array
import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from kvlog.errors import CorruptDataError
from kvlog.format import decode_offsets, encode_offsets

NAME = "log/00000000000000000009.json"
offsets_st = st.lists(st.integers(0, 2**32 - 1), max_size=200)


@settings(max_examples=100, deadline=None)
@given(offsets=offsets_st)
def test_round_trip(offsets: list[int]) -> None:
    text = encode_offsets(offsets)
    assert isinstance(text, str) and text.isascii()
    base64.b64decode(text, validate=True)
    decoded = decode_offsets(NAME, text)
    assert list(decoded) == sorted(set(offsets))
    assert encode_offsets(decoded) == text


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 2**31), runs=st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 5000)), max_size=8))
def test_runs_round_trip(start: int, runs: list[tuple[int, int]]) -> None:
    expected: list[int] = []
    position = start
    for gap, length in runs:
        position += gap
        expected.extend(range(position, position + length))
        position += length
    assert list(decode_offsets(NAME, encode_offsets(expected))) == expected


def test_empty_and_full_ranges() -> None:
    assert list(decode_offsets(NAME, encode_offsets([]))) == []
    full = decode_offsets(NAME, encode_offsets(range(1_000_000)))
    assert len(full) == 1_000_000 and full.min() == 0 and full.max() == 999_999
    assert len(encode_offsets(range(1_000_000))) < 512  # one run container per 64 Ki offsets


def test_ten_million_offsets_with_half_of_them_removed_stay_small() -> None:
    rng = np.random.default_rng(20240611)
    present = np.flatnonzero(rng.random(10_000_000) < 0.5).astype(np.uint32)
    offsets = array.array("I")
    offsets.frombytes(present.tobytes())
    text = encode_offsets(offsets)
    decoded = decode_offsets(NAME, text)
    assert len(text) < 2_000_000  # base64 included; the raw bitmap is about 1.25 MB
    assert len(base64.b64decode(text)) < 1_300_000
    assert len(decoded) == len(present)
    assert decoded == BitMap(offsets)


@pytest.mark.parametrize(
    "garbage",
    ["", "=", "A", "AAA", "AAAA", "not base64!", "AAAA AAAA", "é", "\n",
     base64.b64encode(b"\x00" * 10).decode(), base64.b64encode(b"\xff" * 64).decode()],
)
def test_garbage_is_corrupt(garbage: str) -> None:
    with pytest.raises(CorruptDataError, match="offset bitmap") as caught:
        decode_offsets(NAME, garbage)
    assert caught.value.name == NAME


def test_truncated_bitmaps_are_corrupt() -> None:
    raw = base64.b64decode(encode_offsets(list(range(0, 70_000, 3)) + [1 << 20, 1 << 30]))
    for length in range(len(raw)):
        with pytest.raises(CorruptDataError) as caught:
            decode_offsets(NAME, base64.b64encode(raw[:length]).decode())
        assert caught.value.name == NAME


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40) | st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode()))
def test_any_text_decodes_or_is_corrupt(text: str) -> None:
    # The bitmap has no checksum of its own (the commit's CRC covers it), but no
    # input makes decoding fail with anything other than CorruptDataError.
    try:
        decode_offsets(NAME, text)
    except CorruptDataError as e:
        assert e.name == NAME
