"""A compaction job fails or crashes at every step: the store is always the old or the new state.

A template store (several L0 files, two partitions, deletes) is built once. A
probe run of its compaction through a :class:`FaultyStorage` lists every
storage call of the job; each test case then copies the template, fails or
crashes the job at one of those calls, reopens the store with plain storage and
checks that

* the log holds exactly the records of the old state or of the new one (as a
  fault-free run computes it), nothing lost and nothing duplicated;
* ``scan`` equals the model and ``check()`` finds nothing (also in a fresh cache);
* GC deletes every leftover: afterwards the data directory holds the live files only;
* a later round (at the same time) reaches exactly the new state.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog import KvlogError, ManualClock, SeededIdSource
from kvlog.storage import LocalStorage
from kvlog.testing import Event, FaultPlan, FaultyStorage, SimulatedCrash
from tests.files import copy_store

MANUAL: dict[str, Any] = {
    "flush_interval_ms": 0,
    "flush_bytes": 1 << 30,
    "max_unflushed_bytes": 1 << 30,
    "background_compaction": False,
    "partitions": 2,
    # Data files of their own: the tests fail and crash reads, writes and deletes of the job's data files.
    "commit_inline_bytes": 0,
}
DELAY = 60_000  # file_delete_delay_ms
Rec = tuple[int, int, bytes, bytes | None]


@dataclass
class Template:
    path: Path
    start: int
    now: int
    old: list[Rec] = field(default_factory=list)
    new: list[Rec] = field(default_factory=list)
    model: dict[bytes, bytes] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


def open_case(path: Path, clock: ManualClock, storage: kvlog.Storage | None = None,
              cache: str = "cache", *, seeded: bool = False) -> kvlog.Store:
    """Open a copy; ``seeded``: the job draws the same file names in every copy (the probe's)."""
    # Seeded ids only for the one run of a copy: the same seed on a second open of the same
    # store would draw commit ids its cache already knows.
    ids = SeededIdSource(7) if seeded else None
    return kvlog.open(storage or LocalStorage(path / "root", fsync=False), cache_dir=path / cache,
                      clock=clock, ids=ids, **MANUAL)


def records(store: kvlog.Store) -> list[Rec]:
    return [(r.partition, r.offset, r.key, r.value) for r in store.changes()]


def copy_of(template: Template, target: Path) -> Path:
    return copy_store(template.path, target)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    base = tmp_path_factory.mktemp("crash-template")
    start = time.time_ns() // 1_000_000  # real time: GC compares file mtimes with the clock
    tpl = Template(base / "store", start, start + 1_000)
    clock = ManualClock(start)
    store = open_case(tpl.path, clock)
    model: dict[bytes, bytes | None] = {}
    for flush in range(4):
        for i in range(25):
            key = f"key-{(i * 7 + flush) % 13:02}"
            if (i + flush) % 9 == 4:
                store.delete(key)
                model[key.encode()] = None
            else:
                store.put(key, f"{flush}-{i}")
                model[key.encode()] = f"{flush}-{i}".encode()
        store.flush()
    tpl.old = records(store)
    tpl.model = {k: v for k, v in model.items() if v is not None}
    store.close()

    # The reference: the same job without faults.
    reference = copy_of(tpl, base / "reference")
    store = open_case(reference, ManualClock(start + 500), seeded=True)
    report = store.compact(now_ms=tpl.now)
    assert report.rounds == 1 and report.files_in == 4 and not report.partial
    tpl.new = records(store)
    assert tpl.new != tpl.old
    store.close()

    # The probe: every storage call of the job, in order.
    probe = copy_of(tpl, base / "probe")
    faulty = FaultyStorage(LocalStorage(probe / "root", fsync=False))
    store = open_case(probe, ManualClock(start + 500), faulty, seeded=True)
    faulty.reset()
    store.compact(now_ms=tpl.now)
    tpl.events = list(faulty.history)
    assert records(store) == tpl.new
    store.close()
    ops = {e.op for e in tpl.events}
    assert {"open_stream", "stream_read", "put", "swap"} <= ops, ops
    return tpl


def data_files(path: Path) -> set[str]:
    root = path / "root"
    return {str(p.relative_to(root)) for p in (root / "data").rglob("*.arrow")}


def live_files(store: kvlog.Store) -> set[str]:
    return set(store.log.snapshot(lambda r: [e.path for _f, e in r.iter_files()]))


def age_data_files(path: Path) -> None:
    """Let storage time pass: GC judges orphans by file times against the newest commit's."""
    past = time.time() - 2 * DELAY / 1000
    for file in (path / "root" / "data").rglob("*.arrow"):
        os.utime(file, (past, past))


def verify_recovery(template: Template, path: Path, clock: ManualClock) -> str:
    """Reopen with plain storage and check everything; return which state the store was in."""
    store = open_case(path, clock)
    try:
        got = records(store)
        assert got in (template.old, template.new), "neither the old nor the new state"
        state = "old" if got == template.old else "new"
        assert dict(store.scan()) == template.model
        assert store.check() == []
        fresh = open_case(path, clock, cache="fresh-cache")
        try:
            assert records(fresh) == got
            assert fresh.check() == []
        finally:
            fresh.close()
        # Leftovers (outputs of a job that never committed, replaced inputs) are GC's to delete.
        clock.advance(DELAY + 3_600_000)
        age_data_files(path)
        store.log.gc(clock.now_ms())
        assert data_files(path) == live_files(store)
        # And the store goes on: a round at the same time reaches exactly the new state.
        if state == "old":
            assert store.compact(now_ms=template.now).rounds == 1
        assert records(store) == template.new
        assert store.compact(now_ms=template.now).rounds == 0
        assert store.check() == []
        return state
    finally:
        store.close()


def run_faulty(template: Template, path: Path, plan: FaultPlan) -> tuple[BaseException | None, FaultyStorage]:
    faulty = FaultyStorage(LocalStorage(path / "root", fsync=False))
    store = open_case(path, ManualClock(template.start + 500), faulty, seeded=True)
    faulty.set_plan(plan)
    outcome: BaseException | None = None
    try:
        store.compact(now_ms=template.now)
    except (SimulatedCrash, KvlogError) as e:
        outcome = e
    finally:
        faulty.set_plan(None)
        store.close(flush=False)
    return outcome, faulty


# -- the cases ------------------------------------------------------------------------------------

def test_the_probe_sees_two_streams_per_input_and_one_commit(template: Template) -> None:
    opened = [e for e in template.events if e.op == "open_stream"]
    inputs = {e.name for e in opened}
    assert len(inputs) == 4 and len(opened) == 8  # stream A and stream B of each input
    commits = [e for e in template.events if e.op == "swap"]
    assert len(commits) == 1 and commits[0].name == "log/head.json"
    outputs = [e for e in template.events if e.op == "put"]
    assert len(outputs) == 1 and outputs[0].name.startswith("data/2/")
    assert outputs[0].index < commits[0].index  # data first, then the commit


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_at_every_step_of_a_job(template: Template, tmp_path: Path, when: str) -> None:
    states: dict[str, int] = {"old": 0, "new": 0}
    for n, event in enumerate(template.events):
        path = copy_of(template, tmp_path / f"case-{n}")
        outcome, faulty = run_faulty(template, path, event.crash_plan(when))  # type: ignore[arg-type]
        assert faulty.injected, f"step {event} was not reached"
        state = verify_recovery(template, path, ManualClock(template.start + 1_000))
        states[state] += 1
        if outcome is None:
            # Only a call that failed by itself (a read of an object not there) can escape a
            # crash "after" it: the job then went on and committed.
            assert when == "after" and state == "new", event
            shutil.rmtree(path)
            continue
        assert isinstance(outcome, SimulatedCrash), (event, outcome)
        commit = event.op == "swap"
        # The replace commit is the switch: before it lands the old state, after it the new one.
        committed = any(e.op == "swap" for e in template.events[:n])
        if commit:
            assert state == ("new" if when == "after" else "old"), event
        elif not committed:
            assert state == "old", event
        else:
            assert state == "new", event
        shutil.rmtree(path)
    # The swap of the head is the job's last step: only a crash after it leaves the new state.
    assert states["old"] and (states["new"] or when == "before")


WRITES = ("put", "swap")


@pytest.mark.parametrize("kind", ["error", "timeout_after_success"])
def test_a_failing_write_of_a_job(template: Template, tmp_path: Path, kind: str) -> None:
    writes = [e for e in template.events if e.op in WRITES]
    assert writes
    for n, event in enumerate(writes):
        path = copy_of(template, tmp_path / f"case-{n}")
        outcome, faulty = run_faulty(template, path, event.error_plan(kind))  # type: ignore[arg-type]
        assert faulty.injected
        state = verify_recovery(template, path, ManualClock(template.start + 1_000))
        if event.op == "swap":
            # The commit is retried (error) or recognised as landed (timeout): it succeeds.
            assert outcome is None and state == "new", (event, outcome)
        else:
            # An output that may not have been written fails the job; nothing is committed.
            assert isinstance(outcome, KvlogError) and state == "old", (event, outcome)
        shutil.rmtree(path)


def test_a_commit_that_always_fails_leaves_the_old_state(template: Template, tmp_path: Path) -> None:
    path = copy_of(template, tmp_path / "case")
    plan = FaultPlan().fail("swap", "log/head.json", times=None)
    outcome, _faulty = run_faulty(template, path, plan)
    assert isinstance(outcome, KvlogError)
    assert verify_recovery(template, path, ManualClock(template.start + 1_000)) == "old"


def test_a_failing_read_fails_the_partition_and_is_retried_after_backoff(
    template: Template, tmp_path: Path,
) -> None:
    path = copy_of(template, tmp_path / "case")
    faulty = FaultyStorage(LocalStorage(path / "root", fsync=False), FaultPlan().fail("stream_read", "data/*"))
    clock = ManualClock(template.start + 500)
    store = open_case(path, clock, faulty)
    try:
        with pytest.raises(KvlogError):
            store.compact(now_ms=template.now)
        failing = store.stats()["compaction"]["failing_partitions"]
        assert list(failing) == ["0"] and failing["0"]["failures"] == 1
        assert records(store) == template.old
        # Backing off: the partition (and the files holding it) is left alone for now.
        assert store.compact(now_ms=template.now).rounds == 0
        retry_at = failing["0"]["retry_at_ms"]
        assert retry_at > template.now
        report = store.compact(now_ms=retry_at)
        assert report.rounds == 1
        assert store.stats()["compaction"]["failing_partitions"] == {}
        assert store.check() == []
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["error", "crash"])
def test_gc_failing_after_a_job(template: Template, tmp_path: Path, kind: str) -> None:
    path = copy_of(template, tmp_path / "case")
    faulty = FaultyStorage(LocalStorage(path / "root", fsync=False))
    clock = ManualClock(template.start + 500)
    store = open_case(path, clock, faulty)
    try:
        assert store.compact(now_ms=template.now).rounds == 1
        clock.advance(DELAY + 3_600_000)
        faulty.set_plan(FaultPlan().fail("delete", "data/*", nth=2, kind=kind))  # type: ignore[arg-type]
        with pytest.raises((KvlogError, SimulatedCrash)):
            store.log.gc(clock.now_ms())
        assert faulty.injected
        faulty.set_plan(None)
        assert records(store) == template.new
    finally:
        store.close(flush=False)
    assert verify_recovery(template, path, ManualClock(template.start + 1_000)) == "new"


def test_a_partition_that_failed_in_a_merge_is_cleared_when_a_merge_succeeds(tmp_path: Path) -> None:
    faulty = FaultyStorage(LocalStorage(tmp_path / "root", fsync=False))
    clock = ManualClock(time.time_ns() // 1_000_000)
    settings = {**MANUAL, "l0_merge_files": 3, "min_cleanable_dirty_ratio": 1.0}
    store = kvlog.open(faulty, cache_dir=tmp_path / "cache", clock=clock, **settings)
    try:
        for flush in range(3):
            for i in range(6):
                store.put(f"k{i}", str(flush))
            store.flush()
        before = records(store)
        faulty.set_plan(FaultPlan().fail("stream_read", "data/*"))
        with pytest.raises(KvlogError):
            store.compact()
        failing = store.stats()["compaction"]["failing_partitions"]
        assert len(failing) == 1
        faulty.set_plan(None)
        clock.advance(max(f["retry_at_ms"] for f in failing.values()) - clock.now_ms())
        report = store.compact()
        assert (report.kind, report.rounds, report.records_removed) == ("merge", 1, 0)
        # A merge cleans no partition, yet it read and wrote the failed one: it is not failing now.
        assert store.stats()["compaction"]["failing_partitions"] == {}
        assert records(store) == before
        assert store.check() == []
    finally:
        store.close()


def test_a_failing_read_at_any_point_of_the_overlapping_passes(template: Template, tmp_path: Path) -> None:
    """Pass 1 of one partition overlaps pass 2 of the one before: whichever read fails, in
    either pass of either partition, the job fails as a whole with one failing partition, the
    store keeps its old state, and the next round (after the backoff) reaches the new one."""
    reads = [e for e in template.events if e.op == "stream_read"]
    assert len(reads) >= 8  # both passes of both partitions, over 4 files
    for nth in range(1, len(reads) + 1):
        path = copy_of(template, tmp_path / f"case-{nth}")
        faulty = FaultyStorage(LocalStorage(path / "root", fsync=False),
                               FaultPlan().fail("stream_read", "data/*", nth=nth))
        store = open_case(path, ManualClock(template.start + 500), faulty)
        try:
            with pytest.raises(KvlogError):
                store.compact(now_ms=template.now)
            assert faulty.injected
            failing = store.stats()["compaction"]["failing_partitions"]
            assert len(failing) == 1, (nth, failing)
            assert records(store) == template.old
            assert store.check() == []
            report = store.compact(now_ms=next(iter(failing.values()))["retry_at_ms"])
            assert report.rounds == 1 and store.stats()["compaction"]["failing_partitions"] == {}
            assert records(store) == template.new, nth
        finally:
            store.close()
        shutil.rmtree(path)
