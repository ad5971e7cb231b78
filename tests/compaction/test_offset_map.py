"""The offset map: 16-byte slots, a dict's semantics up to its capacity, a prefix when it fills."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlog.compaction.kernels as kernels_module
from kvlog import ConfigError, StoreConfig
from kvlog.compaction.offset_map import (
    MAX_RELATIVE_OFFSET,
    SLOT_BYTES,
    OffsetMap,
    capacity_for,
    fingerprints,
)

#: Each test runs against the C extensions and against their Python twins.
pytestmark = pytest.mark.usefixtures("native")

MiB = 1024 * 1024
SEED = 0x5EED


def fps(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    return fingerprints(keys, SEED)


def offsets(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# -- sizing ---------------------------------------------------------------------------------------

def test_slot_is_16_bytes_and_128_mib_holds_over_7_million_keys() -> None:
    assert SLOT_BYTES == 16
    assert capacity_for(128 * MiB, 0.9) == 7_549_747
    assert capacity_for(128 * MiB, 0.9) >= 7_000_000
    # Kafka's 24-byte entries hold 5,033,164 keys in the same buffer; WarpStream's 41, 3,273,603.
    assert capacity_for(128 * MiB, 0.9) > int(128 * MiB // 24 * 0.9) > int(128 * MiB // 41 * 0.9)


def test_a_128_mib_map_allocates_exactly_its_budget() -> None:
    table = OffsetMap(128 * MiB, 0.9)
    assert table.slots == 8_388_608
    assert table.capacity == 7_549_747
    assert table.nbytes == 128 * MiB


def test_fingerprints_are_96_bits_seeded_and_deterministic() -> None:
    keys = [b"a", b"b", b"a"]
    hi, lo = fingerprints(keys, 1)
    assert hi.dtype == np.uint64 and lo.dtype == np.uint32
    assert (hi[0], lo[0]) == (hi[2], lo[2])
    assert (hi[0], lo[0]) != (hi[1], lo[1])
    hi2, lo2 = fingerprints(keys, 1)
    assert hi.tolist() == hi2.tolist() and lo.tolist() == lo2.tolist()
    other_hi, _ = fingerprints(keys, 2)
    assert other_hi.tolist() != hi.tolist()


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.binary(min_size=1, max_size=70), min_size=1, max_size=12), cut=st.integers(0, 12))
def test_a_keys_fingerprint_does_not_depend_on_its_neighbours(keys: list[bytes], cut: int) -> None:
    """Alone, among longer or shorter keys, in a sliced or chunked Arrow array: one fingerprint."""
    import pyarrow as pa

    alone = [fingerprints([k], SEED) for k in keys]
    together = fingerprints(keys, SEED)
    sliced = fingerprints(pa.array([b"x" * 100, *keys], pa.binary()).slice(1), SEED)
    chunked = fingerprints(pa.chunked_array([pa.array(keys[:cut], pa.binary()), pa.array(keys[cut:], pa.binary())]),
                           SEED)
    for i, (hi, lo) in enumerate(alone):
        for other in (together, sliced, chunked):
            assert (int(other[0][i]), int(other[1][i])) == (int(hi[0]), int(lo[0]))
    distinct = {(int(h), int(lo)) for h, lo in zip(*together, strict=True)}
    assert len(distinct) == len(set(keys))


def test_keys_of_different_lengths_with_zero_padding_differ() -> None:
    keys = [b"a", b"a\x00", b"a\x00\x00\x00\x00\x00\x00\x00", b"a" + bytes(8), b"\x00", b"\x00" * 9]
    hi, lo = fingerprints(keys, SEED)
    assert len({(int(h), int(v)) for h, v in zip(hi, lo, strict=True)}) == len(keys)


def test_a_map_that_cannot_hold_one_key_is_refused() -> None:
    with pytest.raises(ValueError):
        OffsetMap(15, 1.0)
    with pytest.raises(ValueError):
        OffsetMap(64, 0.2)  # 4 slots * 0.2 = 0 keys
    assert OffsetMap(64, 0.25).capacity == 1
    assert OffsetMap(64, 0.5).capacity == 2
    assert OffsetMap(64, 1.0).capacity == 4


def test_store_config_refuses_a_map_without_room_for_one_key() -> None:
    StoreConfig(offset_map_bytes=64, offset_map_load_factor=0.25)  # one key: allowed
    with pytest.raises(ConfigError):
        StoreConfig(offset_map_bytes=32, offset_map_load_factor=1.0)
    with pytest.raises(ConfigError):
        StoreConfig(offset_map_bytes=64, offset_map_load_factor=0.2)


# -- semantics ------------------------------------------------------------------------------------

def test_a_later_offset_of_the_same_key_wins() -> None:
    table = OffsetMap(1024)
    keys = [b"x", b"y", b"x", b"x", b"y"]
    hi, lo = fps(keys)
    assert table.insert(hi, lo, offsets(0, 1, 2, 3, 4)) == 5
    assert table.size == 2
    assert table.lookup(*fps([b"x", b"y"])).tolist() == [3, 4]
    # And across calls: a later insert overwrites.
    assert table.insert(*fps([b"y"]), offsets(9)) == 1
    assert table.lookup(*fps([b"x", b"y", b"z"])).tolist() == [3, 9, -1]
    assert table.size == 2


def test_offsets_are_relative_to_the_pass_base() -> None:
    table = OffsetMap(1024)
    base = 10**12
    table.clear(base=base)
    assert table.insert(*fps([b"a", b"b"]), offsets(base, base + MAX_RELATIVE_OFFSET)) == 2
    assert table.lookup(*fps([b"a", b"b"])).tolist() == [base, base + MAX_RELATIVE_OFFSET]
    with pytest.raises(ValueError):
        table.insert(*fps([b"c"]), offsets(base - 1))
    with pytest.raises(ValueError):
        table.insert(*fps([b"c"]), offsets(base + MAX_RELATIVE_OFFSET + 1))
    assert table.size == 2


def test_insert_stops_exactly_at_capacity_before_a_new_key() -> None:
    table = OffsetMap(64, 0.5)  # 4 slots, 2 keys
    keys = [b"a", b"b", b"a", b"b", b"a", b"c", b"a", b"d"]
    mapped = table.insert(*fps(keys), np.arange(len(keys), dtype=np.int64))
    assert mapped == 5
    assert keys[mapped] not in keys[:mapped]  # the record where it stopped is a new key
    assert table.size == table.capacity == 2
    assert table.full
    # Only the prefix was mapped: the later "a" at offset 6 was not.
    assert table.lookup(*fps([b"a", b"b", b"c", b"d"])).tolist() == [4, 3, -1, -1]
    # A full map still takes keys it holds, and stops at once before a new one.
    assert table.insert(*fps([b"b", b"a", b"c"]), offsets(10, 11, 12)) == 2
    assert table.lookup(*fps([b"a", b"b"])).tolist() == [11, 10]
    assert table.insert(*fps([b"e", b"a"]), offsets(13, 14)) == 0
    assert table.lookup(*fps([b"a"])).tolist() == [11]


def test_insert_of_only_known_keys_never_stops_on_a_full_map() -> None:
    table = OffsetMap(64, 0.25)  # one key
    assert table.insert(*fps([b"k"] * 100), np.arange(100, dtype=np.int64)) == 100
    assert table.lookup(*fps([b"k"])).tolist() == [99]


@pytest.mark.timeout(20)
def test_a_completely_full_map_answers_lookups_of_absent_keys() -> None:
    # Load factor 1.0 fills every slot: a lookup must stop after probing them all
    # (probing forever would hang the compactor's pass 2 on the clean prefix).
    table = OffsetMap(64, 1.0)
    keys = [b"k1", b"k2", b"k3", b"k4"]
    assert table.insert(*fps(keys), offsets(0, 1, 2, 3)) == 4
    assert table.size == table.slots == 4
    assert table.lookup(*fps([b"absent", b"k3", b"other"])).tolist() == [-1, 2, -1]
    assert table.insert(*fps([b"k2", b"new"]), offsets(4, 5)) == 1
    assert table.lookup(*fps(keys)).tolist() == [0, 4, 2, 3]


def test_clear_empties_the_map_for_reuse() -> None:
    table = OffsetMap(256)
    keys = [b"p", b"q", b"r"]
    table.insert(*fps(keys), offsets(0, 1, 2))
    table.clear(base=100)
    assert table.size == 0 and table.base == 100 and not table.full
    assert table.lookup(*fps(keys)).tolist() == [-1, -1, -1]
    assert table.insert(*fps([b"q"]), offsets(105)) == 1
    assert table.lookup(*fps(keys)).tolist() == [-1, 105, -1]


def test_an_all_zero_fingerprint_is_never_the_empty_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    real_kernel = kernels_module.nh_fingerprints

    def zero_first(data, ends, material, first_mix, second_mix, hi, lo):  # type: ignore[no-untyped-def]
        """The real hash, except that the first key's fingerprint is all zero bits (the empty mark)."""
        real_kernel(data, ends, material, first_mix, second_mix, hi, lo)
        hi[0], lo[0] = 0, 0

    monkeypatch.setattr(kernels_module, "nh_fingerprints", zero_first)
    hi, lo = fingerprints([b"zero", b"one"], SEED)
    assert (int(hi[0]), int(lo[0])) != (0, 0)
    assert (int(hi[1]), int(lo[1])) != (0, 0)
    table = OffsetMap(1024)
    assert table.insert(hi[:1], lo[:1], offsets(7)) == 1
    assert table.size == 1
    assert table.lookup(hi[:1], lo[:1]).tolist() == [7]


def test_only_both_words_zero_mark_an_empty_slot() -> None:
    table = OffsetMap(256)
    hi = np.array([0, 0, 5], dtype=np.uint64)
    lo = np.array([1, 2, 0], dtype=np.uint32)
    assert table.insert(hi, lo, offsets(1, 2, 3)) == 3
    assert table.size == 3
    assert table.lookup(hi, lo).tolist() == [1, 2, 3]


# -- against a dict model -------------------------------------------------------------------------

KEYS = st.binary(min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(
    slots=st.integers(1, 16),
    load=st.sampled_from([0.25, 0.5, 0.9, 1.0, 1.0]),
    chunks=st.lists(st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"ab",
                                              b"\x00", b"\xff" * 3]), max_size=12), max_size=6),
    absent=st.lists(KEYS, max_size=6),
)
def test_lookups_equal_a_dict_model_with_many_duplicates(
    slots: int, load: float, chunks: list[list[bytes]], absent: list[bytes],
) -> None:
    if int(slots * load) < 1:
        return
    table = OffsetMap(slots * SLOT_BYTES, load)
    model: dict[bytes, int] = {}
    offset = 0
    stopped = False
    for chunk in chunks:
        if not chunk:
            continue
        hi, lo = fps(chunk)
        mapped = table.insert(hi, lo, np.arange(offset, offset + len(chunk), dtype=np.int64))
        # Model: map records in order until a new key would exceed the capacity.
        expected = 0
        for key in chunk:
            if key not in model and len(model) >= table.capacity:
                break
            model[key] = offset + expected
            expected += 1
        assert mapped == expected
        assert table.size == len(model) <= table.capacity
        offset += len(chunk)
        if mapped < len(chunk):
            stopped = True
            assert chunk[mapped] not in model
            break
    # Always probe keys that were never inserted, also on a completely full map.
    probe = sorted(set(model) | set(absent) | {b"never-inserted"})
    got = table.lookup(*fps(probe)).tolist()
    assert got == [model.get(k, -1) for k in probe]
    if stopped:
        assert table.size == table.capacity


@st.composite
def colliding_fingerprints(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    """Fingerprints sharing a few home slots (hi modulo slots), some differing only in ``lo``."""
    slots = draw(st.integers(2, 16))
    homes = draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=3))
    distinct = draw(st.lists(
        st.tuples(st.sampled_from(homes), st.integers(0, 3), st.integers(0, 2)),
        min_size=1, max_size=slots, unique=True,
    ))
    keys = [(home + slots * (multiple + 1), lo) for home, multiple, lo in distinct]
    sequence = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=40))
    return slots, sequence


@settings(max_examples=150, deadline=None)
@given(case=colliding_fingerprints())
def test_home_slot_collisions_equal_a_dict_model(case: tuple[int, list[tuple[int, int]]]) -> None:
    slots, sequence = case
    table = OffsetMap(slots * SLOT_BYTES, 1.0)
    hi = np.array([k[0] for k in sequence], dtype=np.uint64)
    lo = np.array([k[1] for k in sequence], dtype=np.uint32)
    mapped = table.insert(hi, lo, np.arange(len(sequence), dtype=np.int64))
    model: dict[tuple[int, int], int] = {}
    expected = len(sequence)
    for i, key in enumerate(sequence):
        if key not in model and len(model) >= table.capacity:
            expected = i
            break
        model[key] = i
    assert mapped == expected
    probe = sorted(set(sequence))
    got = table.lookup(np.array([k[0] for k in probe], dtype=np.uint64),
                       np.array([k[1] for k in probe], dtype=np.uint32)).tolist()
    assert got == [model.get(k, -1) for k in probe]


def test_mapped_offsets_are_the_latest_offset_of_every_key() -> None:
    table = OffsetMap(64 * SLOT_BYTES)
    table.clear(base=100)
    keys = [b"a", b"b", b"a", b"c", b"b", b"a"]
    assert table.insert(*fps(keys), np.arange(100, 106, dtype=np.int64)) == 6
    mapped = np.concatenate(list(table.mapped_offsets(rows=7)))
    assert sorted(mapped.tolist()) == [3, 4, 5]  # c at 103, b at 104, a at 105 (relative to 100)


def test_offsets_out_of_order_give_the_same_table_as_in_order() -> None:
    keys = [b"k%d" % (i % 7) for i in range(40)]
    hi, lo = fps(keys)
    in_order, out_of_order = OffsetMap(64 * SLOT_BYTES), OffsetMap(64 * SLOT_BYTES)
    for start in range(0, 40, 8):  # the ascending path
        in_order.insert(hi[start : start + 8], lo[start : start + 8], np.arange(start, start + 8, dtype=np.int64))
    for start in reversed(range(0, 40, 8)):  # the general path: later chunks first
        out_of_order.insert(hi[start : start + 8], lo[start : start + 8], np.arange(start, start + 8, dtype=np.int64))
    probe_hi, probe_lo = fps([b"k%d" % i for i in range(9)])
    assert in_order.lookup(probe_hi, probe_lo).tolist() == out_of_order.lookup(probe_hi, probe_lo).tolist()
    assert in_order.lookup(probe_hi, probe_lo).tolist() == [35, 36, 37, 38, 39, 33, 34, -1, -1]
    assert in_order.size == out_of_order.size == 7


def test_release_empties_the_table_and_it_can_be_filled_again() -> None:
    table = OffsetMap(1 * MiB)
    keys = [b"key-%d" % i for i in range(10_000)]
    table.insert(*fps(keys), np.arange(10_000, dtype=np.int64))
    table.release()
    assert table.size == 0
    assert (table.lookup(*fps(keys)) == -1).all()
    assert len(np.concatenate(list(table.mapped_offsets()))) == 0
    table.clear(base=50)
    assert table.insert(*fps(keys[:3]), offsets(50, 51, 52)) == 3
    assert table.lookup(*fps(keys[:4])).tolist() == [50, 51, 52, -1]


def test_the_compiled_kernels_refuse_inputs_that_do_not_fit() -> None:
    """The C loops check every size and type before they run: a bad call raises, it never reads
    or writes out of bounds."""
    data = np.frombuffer(b"abcdefgh", dtype=np.uint8)
    material = np.zeros(8, dtype=np.uint32)
    hi, lo = np.empty(1, dtype=np.uint64), np.empty(1, dtype=np.uint32)
    with pytest.raises(ValueError, match="outside the key data"):
        kernels_module.nh_fingerprints(data, np.array([0, 9], dtype=np.int64), material, np.uint64(1), np.uint64(2),
                                       hi, lo)
    with pytest.raises(ValueError, match="outside the key data"):
        kernels_module.nh_fingerprints(data, np.array([4, 2], dtype=np.int64), material, np.uint64(1), np.uint64(2),
                                       hi, lo)
    with pytest.raises(ValueError, match="too small"):
        kernels_module.nh_fingerprints(data, np.array([0, 4, 8], dtype=np.int64), material, np.uint64(1),
                                       np.uint64(2), hi, lo)
    with pytest.raises(ValueError, match="key material"):
        kernels_module.nh_fingerprints(data, np.array([0, 8], dtype=np.int64), material[:5], np.uint64(1),
                                       np.uint64(2), hi, lo)
    with pytest.raises(TypeError, match="uint64"):
        kernels_module.nh_fingerprints(data, np.array([0, 8], dtype=np.int64), material, np.uint64(1), np.uint64(2),
                                       hi.astype(np.int64), lo)
    table = np.zeros((4, 2), dtype=np.uint64)
    with pytest.raises(ValueError, match="too small"):
        kernels_module.insert_rows(table, 5, hi, lo, np.zeros(1, dtype=np.int64), 0, 4)
    with pytest.raises(ValueError, match="one entry per record"):
        kernels_module.insert_rows(table, 4, hi, lo, np.zeros(2, dtype=np.int64), 0, 4)
    with pytest.raises(ValueError, match="too small"):
        kernels_module.lookup_rows(table, 4, hi, lo, np.empty(0, dtype=np.int64))
    with pytest.raises(ValueError, match="too small"):
        kernels_module.mapped_values(table, np.empty(3, dtype=np.uint32))
    with pytest.raises(TypeError, match="C-contiguous"):
        kernels_module.mapped_values(table[::2], np.empty(4, dtype=np.uint32))
    assert not table.any()  # nothing was written
