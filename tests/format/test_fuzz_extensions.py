"""Malformed input to every entry point of the five C extensions and their Python twins: never a
crash (each test runs against both, see the ``native`` fixture).

Each call either returns a value or raises a clean error (``ValueError`` and its kin for bad
buffers, ``TypeError`` for wrong types). For index runs and index values a returned entry is
always one that passes its checksum: damage never comes back as data. A crash fails the
whole run; the AddressSanitizer build of these tests (test_sanitized_extensions.py) also
catches reads and writes outside a buffer that happen not to crash. ``KVLOG_FUZZ_EXAMPLES``
sets the examples per test (default 60: the file runs in seconds).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlog.format.checksum import crc32c
from kvlog.format.columns import binary_column
from kvlog.index import MemTable
from kvlog.index.entry import encode_index_value
from kvlog.index.runs import build_run, run_entries, run_find, run_length, runs_find, walk_run
from kvlog.meta.env import seal
from tests.native import Native

EXAMPLES = int(os.environ.get("KVLOG_FUZZ_EXAMPLES", "60"))
FAST = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CLEAN = (ValueError, TypeError, OverflowError, IndexError, BufferError)

keys_st = st.lists(st.binary(min_size=1, max_size=8), max_size=24, unique=True).map(sorted)


def _run(keys: list[bytes], seed: int) -> bytes:
    """A valid run of ``keys``: inline values, values in data files and deletions."""
    values = [None if (i + seed) % 5 == 0 else bytes([i]) * ((i * 7 + seed) % 12) for i in range(len(keys))]
    n = len(keys)
    return build_run(binary_column(keys), binary_column(values), np.arange(n, dtype=np.int64),
                     np.full(n, seed % 65536, dtype=np.uint16), np.arange(n, dtype=np.int64) * 3,
                     np.array([v is not None for v in values], dtype=bool), 6)


@st.composite
def damaged(draw: st.DrawFn, valid: bytes) -> bytes:
    how = draw(st.sampled_from(["truncate", "flip", "overwrite", "table", "random"]))
    data = bytearray(valid)
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data)))])
    if how == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if how == "overwrite" and data:
        at = draw(st.integers(0, len(data) - 1))
        patch = draw(st.binary(min_size=1, max_size=16))
        data[at : at + len(patch)] = patch
        return bytes(data)
    if how == "table" and len(data) >= 12:  # one u32 of the count or the offset tables
        slot = draw(st.integers(1, (min(len(data), 8 + 8 * struct.unpack_from("<I", data, 4)[0]) - 4) // 4))
        struct.pack_into("<I", data, 4 * slot, draw(st.sampled_from([0, 1, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1)))
        return bytes(data)
    return draw(st.binary(max_size=96))


def _checked(native: Native, key: bytes, value: bytes | None) -> None:
    """A value a run handed out: absent, a deletion, or an index value passing its checksum."""
    if value:
        native.runs.decode(key, value)


# -- index runs ---------------------------------------------------------------------------------

def test_a_crafted_run_whose_key_ends_go_backwards_raises(native: Native) -> None:
    """25 bytes: two entries, the first key ending far outside the run."""
    crafted = struct.pack("<IIIIII", 0x3252564B, 2, 0xFFFFFF00, 1, 0, 0) + b"k"
    assert len(crafted) == 25
    for call in (lambda: run_find(crafted, b"k"), lambda: runs_find([crafted], b"a"),
                 lambda: run_entries(crafted), lambda: list(walk_run(crafted, None, None)),
                 lambda: run_entries(crafted, b"a", b"z", 5, True), lambda: _merged(native, [crafted], None, None),
                 lambda: _merged(native, [_run([b"a"], 1), crafted], b"a", b"z")):
        with pytest.raises(ValueError):
            call()
    old_magic = struct.pack("<IIII", 0x3152564B, 1, 1, 0) + b"k"
    with pytest.raises(ValueError):
        run_find(old_magic, b"k")


@FAST
@given(keys_st, st.integers(0, 1000), st.data())
def test_damaged_runs_raise_or_hand_out_checked_entries(native: Native, keys: list[bytes], seed: int, data: st.DataObject) -> None:
    run = data.draw(damaged(_run(keys, seed)))
    probe = data.draw(st.sampled_from(keys) if keys else st.binary(min_size=1, max_size=8))
    lower = data.draw(st.none() | st.binary(max_size=4))
    upper = data.draw(st.none() | st.binary(max_size=4))
    reverse = data.draw(st.booleans())
    try:
        _checked(native, probe, run_find(run, probe))
    except ValueError:
        pass
    try:
        _checked(native, probe, runs_find([run, memoryview(run)], probe))
    except ValueError:
        pass
    try:
        found = run_entries(run, lower, upper, data.draw(st.integers(-1, 30)), reverse)
    except ValueError:
        found = []
    for key, value in found:
        _checked(native, key, value)
    order = [key for key, _value in found]
    assert order == sorted(order, reverse=reverse) and len(set(order)) == len(order)
    try:
        for key, value in walk_run(run, lower, upper, reverse=reverse):
            _checked(native, key, value)
    except ValueError:
        pass
    try:
        assert run_length(run) >= 0
    except ValueError:
        pass
    try:
        merged = _merged(native, [run, _run(keys[::2], seed + 1), memoryview(run)], lower, upper)
    except ValueError:
        merged = []
    order = [key for key, _item in merged]
    assert order == sorted(set(order))


def _merged(native: Native, runs: list[object], lower: bytes | None, upper: bytes | None) -> list[tuple[bytes, object]]:
    """Every key of a scan's overlay of ``runs`` (``_runs.RunMerge``), read 3 keys at a time."""
    merge = native.runs.RunMerge([], runs, lower, upper, 0)
    out: list[tuple[bytes, object]] = []
    done = False
    while not done:
        chunk, done = merge.chunk(3)
        out.extend(chunk)
    return out


@FAST
@given(st.binary(max_size=64), st.binary(max_size=8), st.one_of(st.none(), st.binary(max_size=4)))
def test_random_bytes_are_not_runs(native: Native, run: bytes, key: bytes, bound: bytes | None) -> None:
    for call in (lambda: run_find(run, key), lambda: runs_find([run], key), lambda: run_entries(run, bound, None),
                 lambda: run_entries(run, None, bound, 3, True), lambda: run_length(run),
                 lambda: _merged(native, [run, run], bound, None)):
        try:
            call()
        except ValueError:
            pass


def test_run_functions_refuse_other_types(native: Native) -> None:
    run = _run([b"a", b"b"], 1)
    for call in (lambda: runs_find([run, 3], b"z"), lambda: runs_find(run, b"a"),  # type: ignore[arg-type, list-item]
                 lambda: native.runs.find(run, None), lambda: native.runs.entries(run, 3, None, 1, False),
                 lambda: native.runs.find_first([run], "a")):
        with pytest.raises(TypeError):
            call()


@FAST
@given(st.lists(st.binary(max_size=6), max_size=8), st.lists(st.none() | st.binary(max_size=6), max_size=8),
       st.lists(st.integers(-3, 10), max_size=8), st.integers(-5, 10), st.data())
def test_build_run_refuses_what_is_not_rows_in_order(native: Native, keys: list[bytes], values: list[bytes | None], rows: list[int],
                                                     inline_limit: int, data: st.DataObject) -> None:
    n = len(rows)
    parts = np.zeros(data.draw(st.sampled_from([n, n + 1, max(n - 1, 0)])), dtype=np.uint16)
    positions = np.zeros(data.draw(st.sampled_from([n, n + 1])), dtype=np.int64)
    live = np.ones(data.draw(st.sampled_from([n, max(n - 1, 0)])), dtype=bool)
    try:
        run = build_run(binary_column(keys), binary_column(values), np.array(rows, dtype=np.int64),
                        parts, positions, live, inline_limit)
    except CLEAN:
        return
    assert run_length(run) == n
    assert [k for k, _v in run_entries(run)] == [keys[r] for r in rows]


@FAST
@given(st.lists(st.binary(max_size=24), min_size=8, max_size=8), st.integers(-2, 100))
def test_raw_build_takes_any_buffers(native: Native, buffers: list[bytes], inline_limit: int) -> None:
    b = buffers
    try:
        native.runs.build(b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], inline_limit)
    except CLEAN:
        pass


# -- index values -------------------------------------------------------------------------------

@FAST
@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_the_compiled_crc32c_equals_the_crc32c_package(native: Native, data: bytes, value: int) -> None:
    """Index entries are sealed in C and in Python: the CPU instruction's CRC, the tables' and
    the crc32c package's are one function."""
    expected = crc32c(data, value)
    assert native.runs.crc32c(data, value) == expected
    assert native.runs.crc32c(data, value, True) == expected


@FAST
@given(st.binary(max_size=40), st.binary(max_size=60), st.data())
def test_index_value_functions_take_any_bytes(native: Native, key: bytes, value: bytes, data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        value = data.draw(damaged(encode_index_value(key or b"k", 1, 2, data.draw(st.none() | st.binary(max_size=9)))))
    for call in (lambda: native.runs.decode(key, value), lambda: native.runs.inline(key, value),
                 lambda: native.runs.inline(memoryview(key), bytearray(value))):
        try:
            call()
        except ValueError:
            pass
    for call in (lambda: native.runs.inline(key), lambda: native.runs.decode(key, value, key),  # type: ignore[call-arg]
                 lambda: native.runs.inline(None, value)):
        with pytest.raises(TypeError):
            call()


# -- LMDB data files ----------------------------------------------------------------------------

#: check_lmdb's names: the key index, the runs, the sealed databases.
NAMES = (b"index", b"runs", (b"sealed",))


def _small_lmdb(path: Path) -> bytes:
    """An LMDB file with kvlog-like databases: a key index (some entries on overflow pages),
    runs, sealed JSON values, plain values, enough keys for branch pages."""
    env = lmdb.open(str(path), map_size=1 << 21, max_dbs=5, subdir=True)
    index, runs, sealed, plain = (env.open_db(name) for name in (b"index", b"runs", b"sealed", b"plain"))
    with env.begin(write=True) as txn:
        for i in range(300):
            key = b"key-%05d" % i
            txn.put(key, encode_index_value(key, i % 3, i, b"v" * (i % 40) if i % 11 else b"w" * 5000,
                                            1_700_000_000_000 + i if i % 7 == 0 else None), db=index)
            txn.put(b"%d" % i, seal(b"%d" % i, b'{"n": %d}' % i), db=sealed)
            txn.put(b"%d" % i, b"%d" % (i * i), db=plain)
        txn.put(b"\x00" * 8, _run([b"a", b"b", b"c"], 2), db=runs)
    with env.begin(write=True) as txn:
        for i in range(0, 300, 4):
            txn.delete(b"%d" % i, db=plain)  # pages on the free list
    env.close()
    data = (path / "data.mdb").read_bytes()
    return data[: (len(data) // 4096) * 4096]


@pytest.fixture(scope="module")
def lmdb_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _small_lmdb(tmp_path_factory.mktemp("lmdb"))


def test_check_lmdb_passes_a_whole_file_and_finds_a_damaged_value(native: Native, lmdb_file: bytes) -> None:
    assert native.cache_check.check_lmdb(lmdb_file, *NAMES) is None
    for needle in (b"key-00123", b'{"n": 123}'):  # an index entry's key; a sealed value
        at = lmdb_file.find(needle)
        damaged = bytearray(lmdb_file)
        damaged[at + 7] ^= 1  # LMDB's own structure still holds
        assert native.cache_check.check_lmdb(bytes(damaged), *NAMES) is not None
    with pytest.raises(TypeError):
        native.cache_check.check_lmdb(lmdb_file, b"index", b"runs", ("sealed",))


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_check_lmdb_of_damaged_files(native: Native, lmdb_file: bytes, seed: int, damages: int) -> None:
    rng = np.random.default_rng(seed)
    pages = len(lmdb_file) // 4096
    bad = bytearray(lmdb_file)
    for _ in range(damages):
        page = int(rng.integers(0, pages))
        how = rng.integers(0, 3)
        if how == 0:  # a whole page of random bytes
            bad[page * 4096 : (page + 1) * 4096] = rng.bytes(4096)
        elif how == 1:  # a few random bytes anywhere in a page
            length = int(rng.integers(1, 33))
            at = page * 4096 + int(rng.integers(0, 4096 - length))
            bad[at : at + length] = rng.bytes(length)
        else:
            bad[page * 4096 + int(rng.integers(0, 4096))] ^= 1 << int(rng.integers(0, 8))
    result = native.cache_check.check_lmdb(bytes(bad), *NAMES)
    assert result is None or isinstance(result, str)
    result = native.cache_check.check_lmdb(bytes(bad[: int(rng.integers(0, len(bad)))]), *NAMES)
    assert result is None or isinstance(result, str)


@FAST
@given(st.binary(max_size=600))
def test_check_lmdb_of_random_bytes(native: Native, data: bytes) -> None:
    assert native.cache_check.check_lmdb(data, *NAMES) is not None


# -- column loops -------------------------------------------------------------------------------

items_st = st.lists(st.none() | st.binary(max_size=8) | st.integers() | st.text(max_size=3), max_size=12)


@FAST
@given(items_st, st.none() | st.lists(st.integers(-3, 14), max_size=14), st.booleans())
def test_pack_binary_takes_any_items_and_order(native: Native, items: list[Any], order: list[int] | None, raw_bytes: bool) -> None:
    order_buffer: Any = None
    if order is not None:
        array = np.array(order, dtype=np.int64)
        order_buffer = array.tobytes()[: len(array) * 8 - (3 if raw_bytes and order else 0)] if raw_bytes else array
    try:
        offsets, data, _validity, nulls = native.columns.pack_binary(items, order_buffer)
    except CLEAN:
        return
    assert len(offsets) >= 4 and nulls >= 0


@FAST
@given(st.lists(st.binary(max_size=32), min_size=7, max_size=7), st.integers(-3, 40))
def test_index_values_takes_any_buffers(native: Native, buffers: list[bytes], inline_limit: int) -> None:
    b = buffers
    try:
        pairs = native.columns.index_values(b[0], b[1], b[2], b[3], b[4], b[5], b[6], inline_limit)
    except CLEAN:
        return
    for key, value in pairs:
        native.runs.decode(key, value)  # what it makes passes its checksum


@FAST
@given(st.lists(st.integers(-5, 40), max_size=10), st.binary(max_size=40))
def test_latest_rows_takes_any_offsets(native: Native, ends: list[int], data: bytes) -> None:
    try:
        rows = np.frombuffer(native.columns.latest_rows(np.array(ends, dtype=np.int32).tobytes(), data), dtype=np.int64)
    except CLEAN:
        return
    assert all(0 <= r < len(ends) - 1 for r in rows.tolist())


# -- compaction kernels -------------------------------------------------------------------------

@FAST
@given(st.binary(max_size=40), st.lists(st.integers(-4, 50), max_size=8), st.integers(0, 40), st.integers(0, 8),
       st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_nh_fingerprints_takes_any_buffers(native: Native, data: bytes, ends: list[int], words: int, out: int, first: int,
                                           second: int) -> None:
    hi = np.zeros(out, dtype=np.uint64)
    lo = np.zeros(out, dtype=np.uint32)
    try:
        native.kernels.nh_fingerprints(data, np.array(ends, dtype=np.int64), np.arange(words, dtype=np.uint32),
                                 first, second, hi, lo)
    except CLEAN:
        pass


@FAST
@given(st.integers(0, 8), st.integers(-2, 9), st.integers(0, 6), st.integers(0, 6), st.integers(0, 6),
       st.integers(-3, 10), st.integers(-3, 10), st.integers(0, 8))
def test_table_kernels_take_any_sizes(native: Native, rows: int, slots: int, n_hi: int, n_lo: int, n_rel: int, size: int,
                                      capacity: int, n_out: int) -> None:
    table = np.zeros(2 * rows, dtype=np.uint64)
    hi = np.arange(1, n_hi + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    lo = np.arange(n_lo, dtype=np.uint32)
    relative = np.arange(n_rel, dtype=np.int64)
    out64 = np.zeros(n_out, dtype=np.int64)
    out32 = np.zeros(n_out, dtype=np.uint32)
    for call in (lambda: native.kernels.insert_rows(table, slots, hi, lo, relative, size, capacity),
                 lambda: native.kernels.lookup_rows(table, slots, hi, lo, out64),
                 lambda: native.kernels.mapped_values(table, out32)):
        try:
            call()
        except CLEAN:
            pass
    with pytest.raises(CLEAN):
        native.kernels.insert_rows(b"\x00" * 16, 1, hi, lo, relative, 0, 1)  # a read-only table


# -- the write buffer ---------------------------------------------------------------------------

def test_write_buffer_misuse_raises(native: Native) -> None:
    with pytest.raises(RuntimeError):
        native.WriteBuffer.__new__(native.WriteBuffer).put(b"k", b"v")  # type: ignore[no-untyped-call]  # never initialised
    table = MemTable()
    buffer = native.WriteBuffer(table, table.lock, lambda: 1, 0)
    with pytest.raises(TypeError):
        buffer.put(b"k")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        buffer.put("k", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        buffer.put(b"k", None)  # type: ignore[arg-type]
    del buffer.keys  # a column deleted
    with pytest.raises(TypeError):
        buffer.put(b"k", b"v")
    buffer.keys, buffer.values, buffer.stamps = [], [], 5  # type: ignore[assignment]
    with pytest.raises(TypeError):
        buffer.put(b"k", b"v")
    buffer.stamps = []
    buffer.fatal = 5  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        buffer.put(b"k", b"v")


def test_write_buffer_survives_a_front_that_deletes_the_columns(native: Native) -> None:
    """Python code run inside put (the memtable's ``front``) deletes the columns and fails."""
    table = MemTable()
    buffer: Any

    class Hostile:
        @property
        def front(self) -> dict[bytes, bytes]:
            del buffer.keys
            buffer.values = 7  # type: ignore[assignment]
            raise KeyError("no front")

    buffer = native.WriteBuffer(Hostile(), table.lock, lambda: 1, 0)
    with pytest.raises(KeyError):
        buffer.put(b"k", b"v")
    assert not table.lock.locked()
