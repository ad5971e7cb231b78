"""Tombstone holds: a consumer group that lags behind ``delete_retention_ms`` still reads every
delete of its keys, because compaction keeps the tombstones (and expired records) at or after
the committed offsets of a group that holds them, until the group is deleted or stops
committing for ``group_hold_max_ms``.

Each test drives compaction with a manual clock, so "a retention period later" is exact. A
group without a hold, reading at the same pace, is the control: it ends with ghost keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from store_support import apply_records

import kvlog
from kvlog import ManualClock
from kvlog.compaction.runner import CompactionReport, Compactor

DAY = 24 * 3600 * 1000
SETTINGS: dict[str, Any] = {
    "partitions": 2, "background_compaction": False, "flush_interval_ms": 0, "delete_retention_ms": 1000,
    "file_delete_delay_ms": 1000, "min_cleanable_dirty_ratio": 0.0, "group_hold_max_ms": DAY,
}


def _open(path: Path, clock: ManualClock, **extra: Any) -> kvlog.Store:
    return kvlog.open(path, clock=clock, **{**SETTINGS, **extra})


def _compact_twice(store: kvlog.Store, clock: ManualClock) -> int:
    """Two rounds a retention period apart (the first stamps new tombstones, the second may
    remove them); the tombstones removed."""
    removed = 0
    for _ in range(2):
        clock.advance(2_000)
        removed += store.compact(force=True).tombstones_removed
    store.gc()
    return removed


def _lagging_view(path: Path, hold: bool) -> tuple[dict[bytes, bytes], dict[bytes, bytes], int]:
    """A writer's rounds (new keys, deletes and overwrites of the last round's, two compactions
    a retention period apart) with one group reading 20 records a round and committing, far
    behind; then the group reads the rest. (The group's view, the store's keys, tombstones
    removed.)"""
    clock = ManualClock(1_000_000)
    with _open(path, clock) as store:
        consumer = store.consumer("lagging", hold_tombstones=hold)
        view: dict[bytes, bytes] = {}
        removed = 0
        for round_ in range(12):
            for i in range(40):
                store.put(f"k{round_:02d}-{i:02d}", f"v{round_}")
            for i in range(0, 40, 4):
                if round_:
                    store.delete(f"k{round_ - 1:02d}-{i:02d}")
                    store.put(f"k{round_ - 1:02d}-{i + 1:02d}", f"again{round_}")
            store.flush()
            apply_records(view, consumer.poll(timeout_s=0, max_records=20))
            consumer.commit()
            removed += _compact_twice(store, clock)
        while records := consumer.poll(timeout_s=0, max_records=500):
            apply_records(view, records)
        return view, dict(store.scan()), removed


def test_a_lagging_group_that_holds_reads_every_delete_and_ends_with_the_stores_keys(tmp_path: Path) -> None:
    view, expected, removed = _lagging_view(tmp_path / "held", hold=True)
    assert removed > 0  # compaction did remove tombstones: the ones below the hold
    assert view == expected
    # The same without a hold: deletes went unseen, the view keeps keys the store has not.
    view, expected, removed = _lagging_view(tmp_path / "control", hold=False)
    assert removed > 0
    assert set(view) > set(expected)


def test_a_hold_lapses_after_group_hold_max_ms_without_a_commit(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, group_hold_max_ms=60_000) as store:
        store.put("a", "1")
        store.flush()
        consumer = store.consumer("g", hold_tombstones=True)
        store.delete("a")
        store.flush()
        assert _compact_twice(store, clock) == 0  # held
        info, = store.consumer_groups()
        assert info.holding and info.hold_expires_ms == 1_000_000 + 60_000
        assert store.stats()["holds"] == {"0": 0, "1": 0} and store.stats()["holding_groups"] == {"g": 1_060_000}
        clock.advance(60_000)  # no commit for group_hold_max_ms: the hold lapses
        assert not store.consumer_groups()[0].holding
        assert store.stats()["holds"] == {} and store.stats()["holding_groups"] == {}
        assert _compact_twice(store, clock) == 1
        # A commit brings the hold back, from the group's offsets on.
        consumer.commit()
        assert store.consumer_groups()[0].holding


def test_a_commit_by_a_consumer_without_a_hold_keeps_the_groups_hold(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock) as store:
        store.put("a", "1")
        store.flush()
        store.consumer("g", hold_tombstones=True).close()
        plain = store.consumer("g")
        plain.commit()
        store.delete("a")
        store.flush()
        assert _compact_twice(store, clock) == 0
        assert store.consumer_groups()[0].holding


def test_delete_group_ends_the_hold_and_forgets_the_offsets(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock) as store:
        store.put("a", "1")
        store.flush()
        store.consumer("g", hold_tombstones=True)
        store.consumer("other").commit({0: 0})
        store.delete("a")
        store.flush()
        assert _compact_twice(store, clock) == 0
        store.delete_group("g")
        assert [info.name for info in store.consumer_groups()] == ["other"]
        assert store.stats()["consumer_groups"] == {"other": {"0": 0}}
        # The held tombstone was stamped again by the last round: it goes a retention later.
        assert _compact_twice(store, clock) == 1
        with pytest.raises(kvlog.GroupNotFoundError, match="no consumer group 'g'"):
            store.delete_group("g")
        # A group of the same name starts afresh.
        assert store.consumer("g").position(0) == store.begin_offsets()[0]


def test_groups_list_offsets_lags_and_holds(tmp_path: Path) -> None:
    clock = ManualClock(5_000)
    with _open(tmp_path / "s", clock) as store:
        assert store.consumer_groups() == []
        for i in range(20):
            store.put(f"k{i}", "v")
        store.flush()
        ends = store.end_offsets()
        assert ends[0] >= 2
        c = store.consumer("reader", partitions=[0])
        assert len(c.poll(timeout_s=0, max_records=2)) == 2
        clock.advance(7)
        c.commit()
        store.consumer("holder", hold_tombstones=True)
        holder, reader = store.consumer_groups()
        assert reader == kvlog.GroupInfo("reader", {0: 2}, {0: ends[0] - 2}, 5_007, None, False)
        assert holder == kvlog.GroupInfo("holder", {0: 0, 1: 0}, ends, 5_007, 5_007 + DAY, True)


def test_a_hold_that_starts_while_a_compaction_runs_refuses_its_commit(tmp_path: Path) -> None:
    """A cleaning round read the holds at one version; a hold that starts before the round
    commits would lose records the round left out: the round's commit is refused, and the next
    round keeps them."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock) as store, _open(tmp_path / "s", clock, cache_dir=tmp_path / "c2") as other:
        store.put("a", "1")
        store.flush()
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)  # stamps the tombstone's horizon
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None and plan.holds_at == store.log.version
        other.consumer("late", hold_tombstones=True)  # at offset 0 of every partition
        store.refresh()
        report = compactor._run(plan, batches, clock.now_ms(), CompactionReport())
        assert report.refused
        assert store.compact(force=True).tombstones_removed == 0
        late = store.consumer("late")
        assert [(r.key, r.value) for r in late.poll(timeout_s=0)] == [(b"a", None)]  # the put was superseded


def test_a_hold_moved_back_refuses_a_round_planned_before(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock) as store:
        store.put("a", "1")
        store.delete("a")
        store.flush()
        holder = store.consumer("g", hold_tombstones=True)
        holder.seek_to_end()
        holder.commit()
        clock.advance(2_000)
        store.compact(force=True)
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None
        holder.seek_to_beginning()
        holder.commit()  # back to offset 0: the round planned before would remove what it holds
        assert compactor._run(plan, batches, clock.now_ms(), CompactionReport()).refused
        # Moving forward again changes nothing that matters to a round planned before.
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None
        holder.seek_to_end()
        holder.commit()
        assert not compactor._run(plan, batches, clock.now_ms(), CompactionReport()).refused


def test_holds_survive_a_fresh_cache_that_starts_from_a_checkpoint(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, checkpoint_interval=2, commit_retention_ms=0) as store:
        store.put("a", "1")
        store.flush()
        store.consumer("g", hold_tombstones=True)
        for i in range(6):
            store.put(f"x{i}", "v")
            store.flush()
        store.gc()
        expected = store.consumer_groups()
    with _open(tmp_path / "s", clock, cache_dir=tmp_path / "fresh") as fresh:
        assert fresh.consumer_groups() == expected
        assert fresh.stats()["holds"] == {"0": 0, "1": 0}


def test_an_expired_record_is_held_like_a_tombstone(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, partitions=1) as store:
        consumer = store.consumer("g", hold_tombstones=True)
        store.put("a", "short", ttl_ms=10)
        store.flush()
        clock.advance(5_000)
        for _ in range(3):
            clock.advance(2_000)
            assert store.compact(force=True).expired_removed == 0
        assert [(r.key, r.value) for r in consumer.poll(timeout_s=0)] == [(b"a", b"short")]
        consumer.commit()
        for _ in range(2):
            clock.advance(2_000)
            store.compact(force=True)
        assert store.stats()["records"] == 0


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_hold_tombstones_is_a_bool(tmp_path: Path, bad: object) -> None:
    with _open(tmp_path / "s", ManualClock(1)) as store:
        with pytest.raises(kvlog.InvalidRecordError, match="hold_tombstones must be True or False"):
            store.consumer("g", hold_tombstones=bad)  # type: ignore[arg-type]
        assert store.consumer_groups() == []


@pytest.mark.parametrize("bad", [-1, 1.5, "7d", True])
def test_group_hold_max_ms_is_checked(tmp_path: Path, bad: object) -> None:
    with pytest.raises(kvlog.ConfigError, match="group_hold_max_ms"):
        kvlog.open(tmp_path / "s", group_hold_max_ms=bad)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("bad", ["", 5, "a\x00b"])
def test_delete_group_refuses_a_bad_name(tmp_path: Path, bad: object) -> None:
    with _open(tmp_path / "s", ManualClock(1)) as store:
        version = store.log.version
        with pytest.raises(kvlog.InvalidRecordError):
            store.delete_group(bad)  # type: ignore[arg-type]
        assert store.log.version == version


def test_a_read_only_store_neither_holds_nor_deletes_groups(tmp_path: Path) -> None:
    with _open(tmp_path / "s", ManualClock(1)) as store:
        store.consumer("g").commit({0: 0})
    with kvlog.open(tmp_path / "s", read_only=True) as reader:
        with pytest.raises(kvlog.ReadOnlyError):
            reader.consumer("h", hold_tombstones=True)
        with pytest.raises(kvlog.ReadOnlyError):
            reader.delete_group("g")
        assert [info.name for info in reader.consumer_groups()] == ["g"]


@pytest.mark.parametrize(("info", "reason"), [
    ({"group": "g", "offsets": {}, "hold_ms": -1}, "malformed hold_ms"),
    ({"group": "g", "offsets": {}, "hold_ms": True}, "malformed hold_ms"),
    ({"group": "g", "offsets": {"0": 1}, "delete": True}, "carries no offsets"),
    ({"group": "g", "offsets": {}, "delete": "yes"}, "carries no offsets"),
])
def test_a_malformed_group_commit_is_refused_by_every_reader(tmp_path: Path, info: dict[str, Any],
                                                             reason: str) -> None:
    from kvlog.format.commit import Commit

    with _open(tmp_path / "s", ManualClock(1)) as store:
        store.consumer("g").commit({0: 3})
        outcome = store.log.commit(lambda v: Commit(v, store.log.new_id(), 1, "offsets", info=info))
        assert outcome.refusal is not None and reason in outcome.refusal.message
        assert store.consumer_groups()[0].offsets == {0: 3}
