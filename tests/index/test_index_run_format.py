"""Index runs (kvlog.index.runs): built from Arrow columns, searched and listed in place."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlog.format.columns import binary_column
from kvlog.index import runs
from kvlog.index.entry import encode_index_value
from kvlog.index.runs import build_run, run_entries, run_find, run_length, runs_find, walk_run

#: Each test runs against the C extensions and against their Python twins.
pytestmark = pytest.mark.usefixtures("native")

keys_st = st.lists(st.binary(min_size=1, max_size=6), min_size=0, max_size=40, unique=True)


@st.composite
def run_inputs(draw: st.DrawFn) -> tuple[list[bytes], list[bytes | None], list[int], list[int], int]:
    keys = sorted(draw(keys_st))
    values = [draw(st.one_of(st.none(), st.binary(max_size=12))) for _ in keys]
    partitions = [draw(st.integers(0, 65535)) for _ in keys]
    offsets = [draw(st.integers(0, 2**63 - 1)) for _ in keys]
    inline_limit = draw(st.integers(0, 12))
    return keys, values, partitions, offsets, inline_limit


def expected_value(key: bytes, value: bytes | None, partition: int, offset: int, inline_limit: int) -> bytes:
    if value is None:
        return b""
    return encode_index_value(key, partition, offset, value if len(value) <= inline_limit else None)


def make_run(keys: list[bytes], values: list[bytes | None], partitions: list[int], offsets: list[int],
             inline_limit: int, rows: list[int] | None = None) -> bytes:
    """A run over columns holding the records shuffled, taken back in key order by ``rows``."""
    n = len(keys)
    shuffled = list(range(n))[::-1]  # column position of record i is n - 1 - i
    column_keys = [keys[i] for i in shuffled]
    column_values = [values[i] for i in shuffled]
    order = [n - 1 - i for i in range(n)] if rows is None else rows
    return build_run(
        binary_column(column_keys), binary_column(column_values), np.array(order, dtype=np.int64),
        np.array(partitions, dtype=np.uint16), np.array(offsets, dtype=np.int64),
        np.array([v is not None for v in values], dtype=bool), inline_limit,
    )


@settings(max_examples=200, deadline=None)
@given(run_inputs(), st.lists(st.binary(max_size=7), max_size=10))
def test_find_matches_a_dict(inputs: tuple, probes: list[bytes]) -> None:
    keys, values, partitions, offsets, inline_limit = inputs
    run = make_run(keys, values, partitions, offsets, inline_limit)
    model = {k: expected_value(k, v, p, o, inline_limit)
             for k, v, p, o in zip(keys, values, partitions, offsets, strict=True)}
    assert run_length(run) == len(keys)
    for key in list(model) + probes:
        assert run_find(run, key) == model.get(key)
        assert run_find(memoryview(run), key) == model.get(key)


@settings(max_examples=200, deadline=None)
@given(run_inputs(), st.one_of(st.none(), st.binary(max_size=6)), st.one_of(st.none(), st.binary(max_size=6)),
       st.integers(-1, 45), st.booleans())
def test_entries_are_the_models_slice(inputs: tuple, lower: bytes | None, upper: bytes | None, limit: int,
                                      reverse: bool) -> None:
    keys, values, partitions, offsets, inline_limit = inputs
    run = make_run(keys, values, partitions, offsets, inline_limit)
    model = [(k, expected_value(k, v, p, o, inline_limit))
             for k, v, p, o in zip(keys, values, partitions, offsets, strict=True)
             if (lower is None or k >= lower) and (upper is None or k < upper)]
    if reverse:
        model.reverse()
    if limit >= 0:
        model = model[:limit]
    assert run_entries(run, lower, upper, limit, reverse) == model


def test_walk_goes_chunk_by_chunk_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "WALK_CHUNK", 3)
    keys = [b"k%02d" % i for i in range(20)]
    run = make_run(keys, [b"v"] * 20, [1] * 20, list(range(20)), 8)
    forward = [k for k, _v in walk_run(run, b"k03", b"k17")]
    assert forward == keys[3:17]
    backward = [k for k, _v in walk_run(run, b"k03", b"k17", reverse=True)]
    assert backward == keys[3:17][::-1]
    assert [k for k, _v in walk_run(run, None, None)] == keys


def test_keys_order_is_lmdbs_byte_order() -> None:
    keys = sorted([b"\x00", b"\x00\x00", b"\x7f", b"\x80", b"\xff", b"\xff\x00", b"a", b"ab"])
    run = make_run(keys, [b"x"] * len(keys), [0] * len(keys), list(range(len(keys))), 4)
    assert [k for k, _v in run_entries(run)] == keys
    assert run_find(run, b"\xff\x00") == encode_index_value(b"\xff\x00", 0, keys.index(b"\xff\x00"), b"x")
    assert run_find(run, b"\xfe") is None


def test_rows_out_of_order_duplicated_or_outside_are_refused() -> None:
    keys = binary_column([b"a", b"b", b"c"])
    values = binary_column([b"1", b"2", b"3"])
    parts = np.zeros(2, dtype=np.uint16)
    offsets = np.zeros(2, dtype=np.int64)
    live = np.ones(2, dtype=bool)
    for rows in ([1, 0], [1, 1], [0, 3], [-1, 0]):
        with pytest.raises(ValueError):
            build_run(keys, values, np.array(rows, dtype=np.int64), parts, offsets, live, 8)
    with pytest.raises(ValueError):
        build_run(keys, values, np.array([0, 1, 2], dtype=np.int64), parts, offsets, live, 8)
    with pytest.raises(ValueError):  # empty keys are never index keys
        build_run(binary_column([b""]), binary_column([b"1"]), np.zeros(1, dtype=np.int64),
                  parts[:1], offsets[:1], live[:1], 8)


def test_garbage_is_not_a_run() -> None:
    good = make_run([b"a"], [b"1"], [0], [0], 8)
    for garbage in (b"", b"KVR1", b"\x00" * 16, good[:-1], good + b"\x00"):
        with pytest.raises(ValueError):
            run_find(garbage, b"a")
        with pytest.raises(ValueError):
            run_entries(garbage)
    with pytest.raises(ValueError):
        run_length(b"\x00" * 8)


def test_an_empty_run() -> None:
    run = make_run([], [], [], [], 8)
    assert run_length(run) == 0
    assert run_find(run, b"a") is None
    assert run_entries(run) == []


def test_runs_find_takes_the_first_run_holding_the_key() -> None:
    newer = make_run([b"a", b"c"], [b"new", None], [1, 1], [10, 11], 8)
    older = make_run([b"a", b"b", b"c"], [b"old", b"b", b"c"], [0, 0, 0], [1, 2, 3], 8)
    assert runs_find([newer, older], b"a") == encode_index_value(b"a", 1, 10, b"new")
    assert runs_find([newer, memoryview(older)], b"b") == encode_index_value(b"b", 0, 2, b"b")
    assert runs_find([newer, older], b"c") == b""  # deleted by the newer run
    assert runs_find([older, newer], b"c") == encode_index_value(b"c", 0, 3, b"c")
    assert runs_find([newer, older], b"d") is None
    assert runs_find([], b"a") is None
    with pytest.raises(ValueError):
        runs_find([newer, b"garbage!"], b"b")
    with pytest.raises(TypeError):
        runs_find([newer, 3], b"b")  # type: ignore[list-item]
