"""Attacks on tombstone holds: the promise is that a group that holds tombstones and commits as
it reads sees every delete (and expired record) after its committed offsets, so the view it
builds from the changelog ends with exactly the store's keys.

Each test drives compaction with a manual clock (or a plan taken apart from its run, to put a
commit between the two) and checks the holder's view against the store, or the catalog of
every reader against the others.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from store_support import apply_records

import kvlog
from kvlog import ManualClock
from kvlog.cli.summary import render_stats
from kvlog.compaction.runner import CompactionReport, Compactor
from kvlog.format.commit import Commit
from kvlog.format.envelope import decode_document, encode_document
from kvlog.log.naming import checkpoint_name, commit_name
from kvlog.meta import GroupOffsets

SETTINGS: dict[str, Any] = {
    "partitions": 1, "background_compaction": False, "flush_interval_ms": 0, "delete_retention_ms": 1000,
    "file_delete_delay_ms": 1000, "min_cleanable_dirty_ratio": 0.0,
}


def _open(path: Path, clock: ManualClock, **extra: Any) -> kvlog.Store:
    return kvlog.open(path, clock=clock, **{**SETTINGS, **extra})


def _holds_changed(store: kvlog.Store) -> int:
    return int(store.log.snapshot(lambda r: GroupOffsets(r).holds_changed()))


def test_a_commit_just_before_the_hold_lapses_keeps_what_a_round_planned_at_the_lapse_would_remove(
        tmp_path: Path) -> None:
    """The group commits at ``expiry - 1`` ms (its hold never lapses, in its eyes and in replay's);
    a compaction read its clock one ms later, at the expiry, and planned before that commit
    landed. The round must not remove the tombstone the group has still to read: either it
    plans with the hold, or its commit is refused."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, group_hold_max_ms=10_000) as store:
        store.put("a", "1")
        store.flush()
        consumer = store.consumer("g", hold_tombstones=True)
        view: dict[bytes, bytes] = {}
        apply_records(view, consumer.poll(timeout_s=0))
        consumer.commit()  # at 1_000_000: the hold lapses at 1_010_000 unless the group commits
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)  # stamps the tombstone's horizon (1_003_000)
        expiry = store.consumer_groups()[0].hold_expires_ms
        assert expiry == 1_010_000
        clock.set(expiry - 1)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(expiry, force=True)  # the compactor's clock, a ms later
        assert plan is not None
        consumer.commit()  # built at expiry - 1: the hold goes on, it never lapsed
        assert store.consumer_groups()[0].holding
        compactor._run(plan, batches, expiry, CompactionReport())
        apply_records(view, consumer.poll(timeout_s=0))
        assert view == dict(store.scan()) == {}


def test_a_hold_max_past_what_a_commit_records_holds_for_good(tmp_path: Path) -> None:
    """``group_hold_max_ms`` has no upper bound (a huge value means "never lapse"); the commit
    records at most 2**63 - 1, so creating a holding consumer works and holds."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, group_hold_max_ms=2**64) as store:
        store.put("a", "1")
        store.flush()
        consumer = store.consumer("g", hold_tombstones=True)
        consumer.commit()
        info, = store.consumer_groups()
        assert info.holding and info.hold_expires_ms == 1_000_000 + 2**63 - 1
        store.delete("a")
        store.flush()
        for _ in range(3):
            clock.advance(10**12)
            assert store.compact(force=True).tombstones_removed == 0
        assert [(r.key, r.value) for r in consumer.poll(timeout_s=0)] == [(b"a", None)]
        assert "lapses in" in render_stats(store.stats(), clock.now_ms())


def test_a_hold_of_zero_ms_holds_nothing_and_refuses_no_round(tmp_path: Path) -> None:
    """``group_hold_max_ms=0``: the hold lapses the moment it is committed, so compaction removes
    tombstones as without it, and its commits never refuse a round planned before them."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, group_hold_max_ms=0) as store:
        store.put("a", "1")
        store.flush()
        consumer = store.consumer("g", hold_tombstones=True)
        info, = store.consumer_groups()
        assert not info.holding and info.hold_expires_ms == 1_000_000
        assert store.stats()["holds"] == {}
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None
        consumer.seek_to_beginning()
        consumer.commit()  # "moves back" a hold that holds nothing
        report = compactor._run(plan, batches, clock.now_ms(), CompactionReport())
        assert not report.refused and report.tombstones_removed == 1
        assert _holds_changed(store) == 0


def test_a_group_that_starts_holding_while_a_round_is_in_flight_misses_no_delete(tmp_path: Path) -> None:
    """A group read ``a`` and committed without a hold; ``a`` is deleted and the tombstone's
    horizon passes; a round plans (no hold: it will remove the tombstone); the group starts
    holding at its committed offset, where the tombstone still is. The round must not land
    as planned, or the group keeps ``a`` for good."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock) as store:
        store.put("a", "1")
        store.flush()
        plain = store.consumer("g")
        view: dict[bytes, bytes] = {}
        apply_records(view, plain.poll(timeout_s=0))
        plain.commit()
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)  # stamps the tombstone's horizon
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None and plan.clean[0].hold is None
        plain.close()
        held = store.consumer("g", hold_tombstones=True)
        assert [(r.key, r.value) for r in store.log.read(0, held.position(0))] == [(b"a", None)]
        assert compactor._run(plan, batches, clock.now_ms(), CompactionReport()).refused
        store.compact(force=True)
        apply_records(view, held.poll(timeout_s=0))
        assert view == dict(store.scan()) == {}


View = dict[bytes, tuple[bytes, "int | None"]]


def _applied(view: View, records: Iterable[kvlog.Record]) -> View:
    """``view`` with ``records`` applied in order (a tombstone removes its key)."""
    for record in records:
        if record.value is None:
            view.pop(record.key, None)
        else:
            view[record.key] = (record.value, record.expires_ms)
    return view


def _live(view: View, now_ms: int) -> dict[bytes, bytes]:
    return {k: v for k, (v, expires) in view.items() if expires is None or now_ms < expires}


class _Holder:
    """A consumer group's member that keeps a view built from the changelog (each key's value
    and expiry) and the views it had at its commits, to go back to one as a service restoring
    an older saved state would.

    ``trusted``: the view must end as the store's keys. A hold protects what is in the log when
    it lands: a group that did not hold (or whose hold lapsed at some round) may have missed
    deletes for good, so it is trusted again only once a hold lands while the view plus the log
    from its offsets still make the store's keys (checked at that moment)."""

    def __init__(self, store: kvlog.Store, group: str, hold: bool) -> None:
        self.store = store
        self.group = group
        self.consumer = store.consumer(group, hold_tombstones=hold)
        self.view: View = {}
        self.saved: list[tuple[View, dict[int, int]]] = []
        self.trusted = False
        self.checks = 0
        if hold:
            self._landed()

    def read(self, max_records: int) -> int:
        records = self.consumer.poll(timeout_s=0, max_records=max_records)
        _applied(self.view, records)
        return len(records)

    def _offsets(self) -> dict[int, int]:
        return {p: self.consumer.position(p) for p in self.consumer.partitions}

    def _landed(self) -> None:
        """A hold just landed at the committed offsets: trusted again when nothing the view
        needs is gone from the log already."""
        self.saved.append((dict(self.view), self._offsets()))
        if not self.trusted:
            self.store.flush()
            offsets = self._offsets()
            view = dict(self.view)
            for p, at in offsets.items():
                _applied(view, self.store.log.read(p, at))
            self.trusted = _live(view, self.store.clock.now_ms()) == dict(self.store.scan())

    def commit(self) -> None:
        self.consumer.commit()
        if self.consumer.hold_tombstones:
            self._landed()
        else:
            self.saved.append((dict(self.view), self._offsets()))

    def hold(self) -> None:
        """A new member that holds, starting at the group's committed offsets with the view as
        of the last commit (a restart that starts holding)."""
        self.consumer.close()
        self.view = dict(self.saved[-1][0]) if self.saved else {}
        self.consumer = self.store.consumer(self.group, hold_tombstones=True)
        self._landed()

    def restore(self, rng: Any) -> None:
        """Go back to a saved state (its view and offsets) and commit them: the hold moves back."""
        if not self.saved:
            return
        view, offsets = rng.choice(self.saved[-8:])
        self.view = dict(view)
        self.consumer.seek_all(offsets)
        self.trusted = False
        self.commit()

    def recreate(self, *, hold: bool) -> None:
        """Delete the group and start it afresh (holding or not): the view starts empty."""
        self.consumer.close()
        if any(info.name == self.group for info in self.store.consumer_groups()):
            self.store.delete_group(self.group)
        self.consumer = self.store.consumer(self.group, hold_tombstones=hold)
        self.view, self.saved, self.trusted = {}, [], False
        if hold:
            self._landed()

    def lapse_at(self, now_ms: int) -> None:
        """A round runs at ``now_ms``: a hold that has lapsed by then protects nothing."""
        info = {g.name: g for g in self.store.consumer_groups()}.get(self.group)
        if info is None or info.hold_expires_ms is None or now_ms >= info.hold_expires_ms:
            self.trusted = False

    def compare(self, problems: list[str], when: str) -> None:
        if not self.trusted:
            return
        self.store.flush()
        while self.read(1000):
            pass
        got, want = _live(self.view, self.store.clock.now_ms()), dict(self.store.scan())
        self.checks += 1
        if got != want:
            problems.append(f"{when} {self.group}: view {sorted(got.items())} != store {sorted(want.items())}")


def _model_run(path: Path, seed: int, steps: int) -> tuple[list[str], int]:
    """Random puts (some with a time to live), deletes, flushes, rounds with a tiny offset map
    (they end early), GC, rounds planned at one moment and run later (with a compactor clock a
    few ms ahead), and groups that read a few records at a time, commit, start holding late,
    go back to an older saved state, or are deleted and started again, with holds that lapse.
    Whenever a trusted group has caught up, and at the end, its view must be the store's keys.
    (The mismatches found, how many comparisons were made.)"""
    rng = random.Random(seed)
    clock = ManualClock(1_000_000)
    problems: list[str] = []
    with _open(path, clock, partitions=2, offset_map_bytes=rng.choice([64, 128, 512]),
               delete_retention_ms=rng.choice([0, 300, 2_000]), group_hold_max_ms=rng.choice([3_000, 10**9]),
               checkpoint_interval=rng.choice([3, 50]), commit_retention_ms=0) as store:
        holders = [_Holder(store, "h1", rng.random() < 0.5), _Holder(store, "h2", False)]
        keys = [f"k{i}" for i in range(10)]
        pending: tuple[Compactor, Any, Any, int] | None = None

        def planned_at(now: int) -> None:
            for holder in holders:
                holder.lapse_at(now)

        for step in range(steps):
            roll = rng.random()
            if roll < 0.28:
                store.put(rng.choice(keys), f"v{step}", ttl_ms=rng.choice([None, None, 1, 500, 3_000]))
            elif roll < 0.42:
                store.delete(rng.choice(keys))
            elif roll < 0.5:
                store.flush()
            elif roll < 0.7 and pending is not None:  # no other round while one is in flight
                compactor, plan, batches, now = pending
                pending = None
                planned_at(now)
                try:
                    compactor._run(plan, batches, now, CompactionReport())
                except kvlog.KvlogError:
                    pass  # its inputs were replaced, and collected, meanwhile
            elif roll < 0.6:
                clock.advance(rng.choice([0, 100, 400, 2_500]))
                store.flush()
                planned_at(clock.now_ms())
                store.compact(force=rng.random() < 0.7)
                if rng.random() < 0.3:
                    store.gc()
            elif roll < 0.7:
                clock.advance(rng.choice([0, 100, 400, 2_500]))
                store.flush()
                now = clock.now_ms() + rng.choice([0, 1, 5])  # the compactor's clock may lead
                compactor = Compactor(store.log)
                plan, batches = compactor.plan(now, force=True)
                if plan is not None:
                    planned_at(now)
                    pending = (compactor, plan, batches, now)
            else:
                holder = rng.choice(holders)
                action = rng.random()
                if action < 0.5:
                    holder.read(rng.randint(1, 4) if rng.random() < 0.7 else 1000)
                    if rng.random() < 0.8:
                        holder.commit()
                elif action < 0.7:
                    holder.hold()
                elif action < 0.8:
                    holder.restore(rng)
                elif action < 0.85:
                    holder.recreate(hold=rng.random() < 0.5)
                else:
                    holder.compare(problems, f"seed {seed} step {step}")
        store.flush()
        for _ in range(3):
            clock.advance(3_000)
            planned_at(clock.now_ms())
            store.compact(force=True)
        for holder in holders:
            holder.compare(problems, f"seed {seed} end")
        problems.extend(store.check())
    return problems, sum(h.checks for h in holders)


@pytest.mark.parametrize("seed", [4, 5])
def test_groups_that_read_restore_older_states_and_start_holding_late_end_with_the_stores_keys(
        tmp_path: Path, seed: int) -> None:
    problems, checks = _model_run(tmp_path / "s", seed, 400)
    assert problems == []
    assert checks >= 10


@pytest.mark.parametrize("checkpoint_at", ["before the hold starts", "after the hold starts"])
def test_a_fresh_cache_from_a_checkpoint_refuses_a_stale_round_as_the_writer_did(tmp_path: Path,
                                                                                 checkpoint_at: str) -> None:
    """A round planned before a hold started commits after it: the committing process refuses
    it. A fresh cache that starts from a metadata checkpoint (written before the hold started,
    or after it, so it carries ``holds_changed``) and replays the round must refuse it too:
    every reader then has the tombstone the group holds, and the same groups."""
    clock = ManualClock(1_000_000)
    settings = {"checkpoint_interval": 1000, "commit_retention_ms": 0}
    with _open(tmp_path / "s", clock, **settings) as store:
        store.put("a", "1")
        store.flush()
        plain = store.consumer("g")
        plain.poll(timeout_s=0)
        plain.commit()
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)  # stamps the tombstone's horizon
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None
        if checkpoint_at == "before the hold starts":
            checkpoint = store.log.write_checkpoint()
            store.consumer("g", hold_tombstones=True).close()
        else:
            store.consumer("g", hold_tombstones=True).close()
            checkpoint = store.log.write_checkpoint()
            assert checkpoint == _holds_changed(store)
        store.gc()  # the commits below the checkpoint go: a fresh cache starts from it
        assert not (tmp_path / "s" / commit_name(1)).exists()
        assert compactor._run(plan, batches, clock.now_ms(), CompactionReport()).refused
        expected = [(r.offset, r.key, r.value) for r in store.changes(0)]
        assert expected[-1][1:] == (b"a", None)
        groups, changed = store.consumer_groups(), _holds_changed(store)
    with _open(tmp_path / "s", clock, cache_dir=tmp_path / "fresh", **settings) as fresh:
        assert fresh.log.snapshot(lambda r: r.get_meta("checkpoint_version")) == str(checkpoint).encode()
        assert [(r.offset, r.key, r.value) for r in fresh.changes(0)] == expected
        assert fresh.consumer_groups() == groups and _holds_changed(fresh) == changed
        assert fresh.check() == []


@pytest.mark.parametrize(("info", "reason"), [
    ({"group": "g", "offsets": {"0": 5}, "hold_ms": 2**63}, "malformed hold_ms"),
    ({"group": "g", "offsets": {"0": 5}, "hold_ms": 1.5}, "malformed hold_ms"),
    ({"group": "g", "offsets": {"0": 5}, "hold_ms": "7d"}, "malformed hold_ms"),
    ({"group": "g", "offsets": {"0": 5}, "hold_ms": [1]}, "malformed hold_ms"),
    ({"group": "g", "offsets": {}, "delete": True, "hold_ms": 0}, "carries no offsets and no hold"),
    ({"group": "g", "offsets": {}, "delete": 1}, "carries no offsets and no hold"),
    ({"group": "g", "offsets": {}, "delete": None}, "carries no offsets and no hold"),
    ({"group": "g", "offsets": {"0": -1}, "hold_ms": 5}, "malformed offset"),
    ({"group": "", "offsets": {}, "delete": True}, "names a group"),
    ({"group": "x" * 256, "offsets": {"0": 5}}, "names a group"),
    ({"group": "x" * 600, "offsets": {}, "hold_ms": 5}, "names a group"),
    ({"group": "x" * 600, "offsets": {}, "delete": True}, "names a group"),
    ({"group": "\ud800", "offsets": {}, "hold_ms": 5}, "names a group"),
    ({"group": "\ud800", "offsets": {"0": 5}}, "names a group"),
    ({"group": "x" * 255, "offsets": {"0": 5}, "hold_ms": 5}, None),
    ({"group": "g", "offsets": {"0": 5}, "hold_ms": 2**63 - 1}, None),
    ({"group": "g", "offsets": {"0": 1}, "hold_ms": 0}, None),
    ({"group": "g", "offsets": {}, "delete": False, "hold_ms": 10}, None),
    ({"group": "g", "offsets": {}, "delete": True}, None),
    ({"group": "new", "offsets": {}, "delete": True}, None),
])
def test_every_reader_decides_a_group_commit_alike(tmp_path: Path, info: dict[str, Any], reason: str | None) -> None:
    """An ``offsets`` commit written as is (hold and delete variants, malformed or not): the
    writer's cache, another cache replaying it, and a fresh cache starting from a checkpoint
    written after it agree on the refusal, the groups and ``holds_changed``."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, partitions=2, checkpoint_interval=1000) as store, \
            _open(tmp_path / "s", clock, partitions=2, checkpoint_interval=1000,
                  cache_dir=tmp_path / "other") as other:
        store.consumer("g", hold_tombstones=True).commit({0: 3, 1: 2})
        other.refresh()
        commit_id = store.log.new_id()
        clock.advance(7)
        outcome = store.log.commit(lambda v: Commit(v, commit_id, clock.now_ms(), "offsets", info=info))
        if reason is None:
            assert outcome.refusal is None
        else:
            assert outcome.refusal is not None and reason in outcome.refusal.message
        other.refresh()
        seen = other.log.outcome(commit_id)
        assert seen is not None and seen.refusal == outcome.refusal
        groups, changed = store.consumer_groups(), _holds_changed(store)
        assert other.consumer_groups() == groups and _holds_changed(other) == changed
        store.log.write_checkpoint()
    with _open(tmp_path / "s", clock, partitions=2, cache_dir=tmp_path / "fresh") as fresh:
        assert fresh.consumer_groups() == groups and _holds_changed(fresh) == changed
        assert fresh.stats()["holds"] == _holds_of_groups(groups, clock.now_ms())


def _holds_of_groups(groups: list[kvlog.GroupInfo], now_ms: int) -> dict[str, int]:
    """``stats()["holds"]`` as the groups say: per partition, the lowest offset a holding group committed."""
    out: dict[str, int] = {}
    for info in groups:
        if info.hold_expires_ms is not None and now_ms < info.hold_expires_ms:
            for p, offset in info.offsets.items():
                out[str(p)] = min(out.get(str(p), offset), offset)
    return dict(sorted(out.items()))


@pytest.mark.parametrize(("member", "value"), [
    ("holds_changed", -1), ("holds_changed", 2**64), ("holds_changed", "x"),
    ("groups", {"g": {"last_commit_ms": 5, "hold_ms": -1}}), ("groups", {"g": None}), ("groups", [1]),
])
def test_a_checkpoint_with_malformed_group_state_is_corrupt_data_naming_it(tmp_path: Path, member: str,
                                                                           value: object) -> None:
    """A metadata checkpoint (its envelope intact) whose ``groups`` or ``holds_changed`` is not
    the shape of one is refused as :class:`~kvlog.errors.CorruptDataError` naming it, as every
    other malformed member of a checkpoint is: never a raw error."""
    clock = ManualClock(1_000_000)
    root = tmp_path / "s"
    with _open(root, clock, checkpoint_interval=1000) as store:
        store.consumer("g", hold_tombstones=True)
        store.put("a", "1")
        store.flush()
        version = store.log.write_checkpoint()
    name = checkpoint_name(version)
    body = decode_document(name, (root / name).read_bytes(), "checkpoint")
    body[member] = value
    (root / name).write_bytes(encode_document("checkpoint", body))
    for old in range(1, version):
        (root / commit_name(old)).unlink()
    with pytest.raises(kvlog.CorruptDataError) as info:
        _open(root, clock, cache_dir=tmp_path / "fresh")
    assert info.value.name == name


def test_rounds_at_a_time_before_the_holds_commit_or_far_past_its_lapse_keep_what_it_holds(tmp_path: Path) -> None:
    """``compact(now_ms=...)`` before the hold's commit (a compactor whose clock lags) holds as
    at the commit; far past the lapse while the store's last commit is not, the hold still
    holds (the log's time has not reached the lapse: the group may have committed meanwhile);
    once a commit lands past the lapse, it lapses."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock, group_hold_max_ms=60_000) as store:
        store.put("a", "1")
        store.flush()
        consumer = store.consumer("g", hold_tombstones=True)
        view: dict[bytes, bytes] = {}
        apply_records(view, consumer.poll(timeout_s=0))
        consumer.commit()
        store.delete("a")
        store.flush()
        for now in (1, 500_000, 1_000_000, 10**12, 10**12 + 5_000):
            assert store.compact(force=True, now_ms=now).tombstones_removed == 0
        assert [(r.key, r.value) for r in store.log.read(0, 1)] == [(b"a", None)]
        clock.advance(60_000)  # the lapse, by the store's clock
        store.put("b", "2")
        store.flush()  # a commit past the lapse
        assert store.compact(force=True, now_ms=10**12 + 10_000).tombstones_removed == 1
        apply_records(view, consumer.poll(timeout_s=0))
        assert view == {b"a": b"1", b"b": b"2"}  # the lapse cost it the delete: documented


@pytest.mark.parametrize("holds_at", [10**9, 2**63 - 1, -1, "7", True, None])
def test_a_round_that_claims_to_have_read_the_holds_later_than_it_could_is_refused(
        tmp_path: Path, holds_at: object) -> None:
    """A cleaning round reads the holds before it commits, so its ``holds_at`` is below its
    commit's version. One that names a later version (or none that is a version) cannot show
    it saw a hold that started since: refused like a round that read the holds too early."""
    clock = ManualClock(1_000_000)
    with _open(tmp_path / "s", clock) as store:
        store.put("a", "1")
        store.delete("a")
        store.flush()
        clock.advance(2_000)
        store.compact(force=True)
        clock.advance(2_000)
        compactor = Compactor(store.log)
        plan, batches = compactor.plan(clock.now_ms(), force=True)
        assert plan is not None
        store.consumer("late", hold_tombstones=True)
        forged = dataclasses.replace(plan, holds_at=holds_at)  # type: ignore[arg-type]
        assert compactor._run(forged, batches, clock.now_ms(), CompactionReport()).refused
        assert [(r.key, r.value) for r in store.consumer("late").poll(timeout_s=0)] == [(b"a", None)]
