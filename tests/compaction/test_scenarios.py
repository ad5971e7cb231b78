"""Compaction through a real Store: Kafka's cleaner rules, observed from the outside.

Every store here runs on local disk with a manual clock; nothing flushes or
compacts unless the test says so. ``inline_value_bytes=0`` keeps values out of
the key index, so reads go through the compacted batches and their offset bitmaps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog import InvalidRecordError, ManualClock

SECOND = 1_000


def batches_of(store: kvlog.Store, partition: int = 0) -> list[dict[str, Any]]:
    return store.log.snapshot(lambda r: list(r.iter_batches(partition, 0)))  # type: ignore[no-any-return]


def horizons(store: kvlog.Store, partition: int = 0) -> list[int]:
    return [b.horizon_ms for b in batches_of(store, partition) if b.horizon_ms is not None]


def offsets(store: kvlog.Store, partition: int = 0) -> list[tuple[int, bytes, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in store.changes(partition)]


# -- tombstones -----------------------------------------------------------------------------------

def test_tombstone_lifecycle(tmp_path: Path, make_store: Any, clock: ManualClock, h: Any) -> None:
    retention = 10 * SECOND
    store = make_store(tmp_path / "s", partitions=1, delete_retention_ms=retention, inline_value_bytes=0)
    store.put("a", "1")
    store.put("a", "2")
    store.delete("a")
    store.put("b", "1")
    store.flush()
    t0 = clock.now_ms()

    first = store.compact(now_ms=t0)
    assert (first.rounds, first.tombstones_removed, first.records_removed) == (1, 0, 2)
    # The tombstone is kept (older records of its key are gone) and stamped now + retention.
    assert offsets(store) == [(2, b"a", None), (3, b"b", b"1")]
    assert horizons(store) == [t0 + retention]
    assert store.get("a") is None and store.get("b") == b"1"

    # Before the horizon: not eligible, and even a forced round keeps it without re-stamping.
    assert store.compact(now_ms=t0 + retention - 1).rounds == 0
    forced = store.compact(now_ms=t0 + retention - 1, force=True)
    assert (forced.rounds, forced.tombstones_removed) == (1, 0)
    assert offsets(store) == [(2, b"a", None), (3, b"b", b"1")]
    assert horizons(store) == [t0 + retention]

    # At the horizon an idle partition is eligible (Kafka would wait for new writes), and it goes.
    late = store.compact(now_ms=t0 + retention)
    assert (late.rounds, late.tombstones_removed, late.records_removed) == (1, 1, 1)
    assert offsets(store) == [(3, b"b", b"1")]
    assert horizons(store) == []
    assert store.log.end_offset(0) == 4
    assert store.compact(now_ms=t0 + 10 * retention).rounds == 0
    assert store.check() == []


def test_a_superseded_tombstone_goes_at_once(tmp_path: Path, make_store: Any, clock: ManualClock) -> None:
    store = make_store(tmp_path / "s", partitions=1, inline_value_bytes=0)
    store.put("c", "1")
    store.delete("c")
    store.put("c", "2")
    store.flush()
    report = store.compact()
    assert (report.rounds, report.tombstones_removed, report.records_removed) == (1, 1, 2)
    assert offsets(store) == [(2, b"c", b"2")]
    assert horizons(store) == []
    assert store.get("c") == b"2"


def test_the_tombstones_own_timestamp_does_not_matter(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    retention = 5 * SECOND
    store = make_store(tmp_path / "s", partitions=1, delete_retention_ms=retention)
    producer = store.log.producer()
    ancient = clock.now_ms() - 365 * 86_400_000
    producer.append(0, [(b"k", b"v", ancient), (b"k", None, ancient)], base_sequence=0)
    now = clock.now_ms()
    store.compact(now_ms=now)
    assert offsets(store) == [(1, b"k", None)]
    assert horizons(store) == [now + retention]


def test_tombstones_are_readable_in_the_changelog_until_their_horizon(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    retention = 3 * SECOND
    store = make_store(tmp_path / "s", partitions=2, delete_retention_ms=retention)
    keys = [f"key-{i}" for i in range(20)]
    for key in keys:
        store.put(key, "v")
    for key in keys[::2]:
        store.delete(key)
    store.flush()
    t0 = clock.now_ms()
    store.compact(now_ms=t0)
    deleted = {r.key for r in store.changes() if r.value is None}
    assert deleted == {k.encode() for k in keys[::2]}
    for step in (SECOND, 2 * SECOND, retention - 1):
        store.compact(now_ms=t0 + step)
        assert {r.key for r in store.changes() if r.value is None} == deleted
    report = store.compact(now_ms=t0 + retention)
    assert report.tombstones_removed == len(deleted)
    assert [r for r in store.changes() if r.value is None] == []
    assert sorted(k for k, _ in store.scan()) == sorted(k.encode() for k in keys[1::2])
    assert store.check() == []


# -- min / max compaction lag ---------------------------------------------------------------------

def test_min_compaction_lag_protects_young_batches(tmp_path: Path, make_store: Any, clock: ManualClock) -> None:
    lag = 5 * SECOND
    store = make_store(tmp_path / "s", partitions=1, min_compaction_lag_ms=lag, min_cleanable_dirty_ratio=0.0)
    store.put("k", "v1")
    store.flush()
    clock.advance(SECOND)
    store.put("k", "v2")
    store.flush()
    t1 = clock.now_ms()

    young = store.compact(now_ms=t1 + lag - 1)
    # The second batch is one ms too young: the round stops before it and v1 stays.
    assert young.rounds == 1 and young.checkpoints == {0: 1}
    assert offsets(store) == [(0, b"k", b"v1"), (1, b"k", b"v2")]

    old_enough = store.compact(now_ms=t1 + lag)
    assert old_enough.rounds == 1 and old_enough.checkpoints == {0: 2}
    assert offsets(store) == [(1, b"k", b"v2")]
    assert store.get("k") == b"v2"


def test_max_compaction_lag_cleans_a_barely_dirty_partition(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    max_lag = 60 * SECOND
    store = make_store(tmp_path / "s", partitions=1, min_cleanable_dirty_ratio=0.9,
                       max_compaction_lag_ms=max_lag)
    for i in range(20):
        store.put(f"k{i:02}", "value")
    store.flush()
    assert store.compact().rounds == 1  # ratio 1.0 > 0.9
    clock.advance(SECOND)
    t1 = clock.now_ms()
    store.put("k00", "value")
    store.flush()
    assert store.compact(now_ms=t1).rounds == 0  # ratio about 1/21
    assert store.compact(now_ms=t1 + max_lag).rounds == 0  # strictly older than the lag
    report = store.compact(now_ms=t1 + max_lag + 1)
    assert (report.rounds, report.records_removed) == (1, 1)
    assert [o for o, k, _ in offsets(store) if k == b"k00"] == [20]


# -- partial rounds -------------------------------------------------------------------------------

@pytest.mark.parametrize(("load_factor", "capacity"), [(0.25, 1), (0.5, 2)])
def test_partial_rounds_with_a_tiny_map_continue_until_clean(
    tmp_path: Path, make_store: Any, clock: ManualClock, h: Any, load_factor: float, capacity: int,
) -> None:
    store = make_store(tmp_path / "s", partitions=1, offset_map_bytes=64, offset_map_load_factor=load_factor,
                       min_cleanable_dirty_ratio=0.0, inline_value_bytes=0)
    model: dict[bytes, bytes | None] = {}
    sequence = "aabacbdcaedbbfe"
    for round_no in range(3):
        for i, key in enumerate(sequence):
            value = None if (i + round_no) % 7 == 3 else f"{key}{round_no}{i}".encode()
            if value is None:
                store.delete(key)
            else:
                store.put(key, value)
            model[key.encode()] = value
        store.flush()
    before = h.log_records(store)

    reports = h.compact_until_clean(store)
    assert any(r.partial for r in reports)
    assert not reports[-1].partial
    assert all(r.map_capacity == capacity for r in reports)
    checkpoints = [r.checkpoints[0] for r in reports]
    assert checkpoints == sorted(checkpoints) and checkpoints[-1] == store.log.end_offset(0)

    after = h.log_records(store)
    # Exactly the latest record of every key is left (tombstones too: within retention).
    latest = h.latest_by_key(before)
    assert after == sorted((p, o, k, v) for k, (p, o, v) in latest.items())
    assert {k: v for _p, _o, k, v in after} == model
    assert dict(store.scan()) == {k: v for k, v in model.items() if v is not None}
    for key, value in model.items():
        assert store.get(key) == value
    assert store.check() == []
    assert store.compact().rounds == 0


def test_a_one_key_map_makes_progress_on_every_round(tmp_path: Path, make_store: Any, h: Any) -> None:
    store = make_store(tmp_path / "s", partitions=1, offset_map_bytes=64, offset_map_load_factor=0.25,
                       min_cleanable_dirty_ratio=0.0)
    for i in range(12):
        store.put(f"k{i % 4}", str(i))
    store.flush()
    reports = h.compact_until_clean(store)
    # Keys k0..k3 repeat with period 4: each round maps one key and ends before the next new one.
    assert [r.checkpoints[0] for r in reports] == list(range(1, 13))
    assert [(o, k) for o, k, _ in offsets(store)] == [(8, b"k0"), (9, b"k1"), (10, b"k2"), (11, b"k3")]


# -- re-cleaning, offsets, reads ------------------------------------------------------------------

def test_cleaning_twice_without_new_writes_changes_nothing(
    tmp_path: Path, make_store: Any, clock: ManualClock, h: Any,
) -> None:
    store = make_store(tmp_path / "s", partitions=3, inline_value_bytes=0)
    for i in range(60):
        store.put(f"k{i % 13}", f"v{i}")
        if i % 9 == 0:
            store.delete(f"k{i % 5}")
    store.flush()
    assert store.compact().rounds == 1
    cleaned = h.log_records(store)
    stamps = [(r.partition, r.offset, r.timestamp_ms) for r in store.changes()]
    marks = {p: horizons(store, p) for p in range(3)}

    assert store.compact().rounds == 0
    again = store.compact(force=True)
    assert (again.rounds, again.records_removed, again.tombstones_removed) == (1, 0, 0)
    assert again.records_read == again.records_written == len(cleaned)
    assert h.log_records(store) == cleaned
    assert [(r.partition, r.offset, r.timestamp_ms) for r in store.changes()] == stamps
    assert {p: horizons(store, p) for p in range(3)} == marks
    assert store.compact().rounds == 0
    assert store.check() == []


def test_reading_from_a_removed_offset_continues_at_the_next_survivor(
    tmp_path: Path, make_store: Any,
) -> None:
    store = make_store(tmp_path / "s", partitions=1, inline_value_bytes=0)
    for key, value in [("a", "1"), ("b", "1"), ("b", "2"), ("c", "1"), ("b", "3"), ("d", "1")]:
        store.put(key, value)
    store.flush()
    log = store.log
    assert (log.start_offset(0), log.end_offset(0)) == (0, 6)
    store.compact()
    assert [r.offset for r in log.read(0)] == [0, 3, 4, 5]
    assert [r.offset for r in log.read(0, 1)] == [3, 4, 5]
    assert [r.offset for r in log.read(0, 2)] == [3, 4, 5]
    assert [r.offset for r in log.read(0, 1, 4)] == [3]
    assert [r.offset for r in store.changes(0, 2)] == [3, 4, 5]
    assert list(log.read(0, 6)) == []
    # The first record survived: neither end moved. The next write continues after the end.
    assert (log.start_offset(0), log.end_offset(0)) == (0, 6)
    store.put("d", "2")
    store.flush()
    assert [r.offset for r in log.read(0, 5)] == [5, 6]


def test_the_log_end_does_not_move_when_its_last_records_are_removed(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    store = make_store(tmp_path / "s", partitions=1, delete_retention_ms=0)
    store.put("x", "1")
    store.put("y", "1")
    store.put("y", "2")
    store.delete("y")
    store.flush()
    store.compact(now_ms=clock.now_ms())
    store.compact(now_ms=clock.now_ms())  # the horizon (now + 0) has passed
    assert offsets(store) == [(0, b"x", b"1")]
    assert store.log.end_offset(0) == 4
    store.put("z", "1")
    store.flush()
    assert offsets(store)[-1] == (4, b"z", b"1")


def test_survivors_keep_their_offsets_order_and_timestamps(
    tmp_path: Path, make_store: Any, clock: ManualClock, h: Any,
) -> None:
    store = make_store(tmp_path / "s", partitions=4, inline_value_bytes=0)
    for i in range(200):
        clock.advance(7)
        key = f"key-{(i * 7919) % 37}"
        if i % 11 == 5:
            store.delete(key)
        else:
            store.put(key, f"value-{i}" * (1 + i % 3))
        if i % 40 == 39:
            store.flush()
    store.flush()
    before = [(r.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in store.changes()]
    scan_before = list(store.scan())
    get_before = {k: store.get(k) for k in {r[3] for r in before}}

    store.compact()

    after = [(r.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in store.changes()]
    assert len(after) < len(before)
    survivors = iter(before)
    assert all(record in survivors for record in after)  # a subsequence: same offsets, same order
    for p in range(4):
        own = [r[1] for r in after if r[0] == p]
        assert own == sorted(set(own))
    latest = {r[3]: r for r in before}
    assert {r[3]: r for r in after} == latest  # every key's latest record survives
    assert list(store.scan()) == scan_before
    assert list(store.scan(reverse=True)) == scan_before[::-1]
    assert {k: store.get(k) for k in get_before} == get_before
    assert store.check() == []


def test_a_scan_keeps_its_snapshot_while_a_round_removes_its_records(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    path = tmp_path / "s"
    store = make_store(path, partitions=1, inline_value_bytes=0)
    for i in range(6):
        store.put(f"k{i}", f"old{i}")
    store.close()
    store = make_store(path, partitions=1, inline_value_bytes=0)
    scan = store.scan()
    assert next(scan) == (b"k0", b"old0")
    for i in range(6):
        store.put(f"k{i}", f"new{i}")
    store.flush()
    assert store.compact().records_removed == 6
    assert list(scan) == [(f"k{i}".encode(), f"old{i}".encode()) for i in range(1, 6)]
    assert list(store.scan()) == [(f"k{i}".encode(), f"new{i}".encode()) for i in range(6)]


# -- producers and bad input ----------------------------------------------------------------------

def test_a_resend_of_a_compacted_batch_returns_its_original_offsets(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    path = tmp_path / "s"
    store = make_store(path, partitions=1)
    producer = store.log.producer()
    first = producer.append(0, [(b"k", b"v1"), (b"k", b"v2")], base_sequence=0)
    assert (first.base_offset, first.last_offset, first.duplicate) == (0, 1, False)
    producer.append(0, [(b"k", b"v3")], base_sequence=2)
    report = store.compact()
    assert report.records_removed == 2
    assert offsets(store) == [(2, b"k", b"v3")]

    again = producer.append(0, [(b"k", b"v1"), (b"k", b"v2")], base_sequence=0)
    assert (again.base_offset, again.last_offset, again.duplicate) == (0, 1, True)
    assert store.log.end_offset(0) == 3
    assert offsets(store) == [(2, b"k", b"v3")]

    # The window lives in the metadata, so a process with a fresh cache (replaying the
    # log) still recognises the resend.
    pid, epoch = producer.producer_id, producer.epoch
    store.close()
    other = make_store(path, partitions=1, cache_dir=tmp_path / "fresh-cache")
    resumed = other.log.producer(pid, epoch=epoch)
    third = resumed.append(0, [(b"k", b"v1"), (b"k", b"v2")], base_sequence=0)
    assert (third.base_offset, third.last_offset, third.duplicate) == (0, 1, True)
    assert offsets(other) == [(2, b"k", b"v3")]
    assert other.check() == []


@pytest.mark.parametrize("bad_key", [None, b"", 42])
def test_keyless_input_is_rejected_whole(tmp_path: Path, make_store: Any, bad_key: Any) -> None:
    store = make_store(tmp_path / "s", partitions=1)
    store.put("kept", "1")
    store.flush()
    version, end = store.log.version, store.log.end_offset(0)
    files = sorted((tmp_path / "s" / "data").rglob("*.arrow"))
    producer = store.log.producer()
    version = store.log.version  # registering the producer is a commit
    with pytest.raises(InvalidRecordError):
        producer.append(0, [(b"a", b"1"), (bad_key, b"x")], base_sequence=0)
    with pytest.raises(ValueError):
        store.put(bad_key, "x")
    with pytest.raises(InvalidRecordError):
        with store.batch() as batch:
            batch.put("b", "1")
            batch.put(bad_key, "x")
    store.flush()
    assert (store.log.version, store.log.end_offset(0)) == (version, end)
    assert sorted((tmp_path / "s" / "data").rglob("*.arrow")) == files
    assert offsets(store) == [(0, b"kept", b"1")]
    assert store.get("b") is None


# -- merges and reports ---------------------------------------------------------------------------

def test_l0_files_are_merged_without_removing_anything(tmp_path: Path, make_store: Any, h: Any) -> None:
    store = make_store(tmp_path / "s", partitions=3, l0_merge_files=3, min_cleanable_dirty_ratio=1.0)
    for flush in range(3):
        for i in range(10):
            store.put(f"k{i}", f"v{flush}")
        store.flush()
        if flush < 2:
            assert store.compact().rounds == 0
    before = h.log_records(store)
    report = store.compact()
    assert (report.kind, report.rounds, report.files_in, report.records_removed) == ("merge", 1, 3, 0)
    assert report.partitions == []
    assert h.log_records(store) == before
    levels = store.stats()["levels"]
    assert set(levels) == {"1"} and levels["1"]["files"] == report.files_out
    assert store.check() == []
    # A forced cleaning round over the merged file then removes the history.
    assert store.compact(force=True).records_removed == 20
    assert store.stats()["compaction"]["rounds"] == 2


def test_stats_report_the_last_round(tmp_path: Path, make_store: Any) -> None:
    store = make_store(tmp_path / "s", partitions=2, offset_map_bytes=1024)
    for i in range(10):
        store.put("same", str(i))
    store.flush()
    report = store.compact()
    stats = store.stats()["compaction"]
    assert stats["rounds"] == 1
    assert stats["failing_partitions"] == {} and stats["last_error"] is None
    assert stats["map_capacity"] == 57  # 1024 / 16 * 0.9
    assert stats["last_report"]["records_removed"] == report.records_removed == 9
    assert stats["background"] is False


# -- caches that fall behind garbage collection ---------------------------------------------------

def test_a_cache_that_fell_behind_gc_still_catches_up(
    tmp_path: Path, make_store: Any, clock: ManualClock, h: Any,
) -> None:
    path = tmp_path / "s"
    # Data files of their own: the cache behind replays an append whose data file GC deleted.
    writer = make_store(path, partitions=2, inline_value_bytes=0, file_delete_delay_ms=1_000,
                        commit_inline_bytes=0)
    for i in range(30):
        writer.put(f"k{i % 9}", f"a{i}")
    writer.flush()
    behind = make_store(path, partitions=2, read_only=True, cache_dir=tmp_path / "behind-cache")
    assert behind.get("k0") == b"a27"
    # Meanwhile: more appends, a round that replaces every file, and GC of the replaced inputs.
    for i in range(30):
        writer.put(f"k{i % 9}", f"b{i}")
    writer.flush()
    assert writer.compact().rounds == 1
    clock.advance(2_000)
    assert writer.gc()["replaced"] == 2
    expected = dict(writer.scan())
    records = h.log_records(writer)

    # Replaying the append whose file is gone must not fail: the index is rebuilt instead.
    behind.refresh()
    assert dict(behind.scan()) == expected
    assert {k: behind.get(k) for k in expected} == expected
    assert h.log_records(behind) == records
    assert behind.check() == []
    # And a brand-new cache, replaying the whole commit log, gets there too.
    fresh = make_store(path, partitions=2, read_only=True, cache_dir=tmp_path / "fresh-cache")
    assert dict(fresh.scan()) == expected
    assert h.log_records(fresh) == records
    assert fresh.check() == []
