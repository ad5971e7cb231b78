"""Compaction racing writers, readers and other compactors: a replace never loses a write."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog import ManualClock
from kvlog.compaction import Compactor
from kvlog.config import StoreConfig
from kvlog.log import open_log
from kvlog.storage import LocalStorage
from kvlog.testing import FaultPlan, FaultyStorage

WRITERS = 3
KEYS_PER_WRITER = 12


def run_writers(store: kvlog.Store, rounds: int, errors: list[BaseException],
                model: dict[bytes, bytes], lock: threading.Lock) -> list[threading.Thread]:
    """Writers on disjoint keys; values carry their key, so a reader can tell a neighbour's value."""

    def writer(w: int) -> None:
        try:
            for i in range(rounds):
                key = f"w{w}-k{i % KEYS_PER_WRITER:02}"
                value = f"{key}={i:05}" + "x" * (i % 50)
                store.put(key, value, sync=(i % 17 == 0))
                with lock:
                    model[key.encode()] = value.encode()
                if i % 40 == 39:
                    store.flush()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    return threads


def run_reader(store: kvlog.Store, stop: threading.Event, errors: list[BaseException]) -> threading.Thread:
    def reader() -> None:
        try:
            while not stop.is_set():
                for w in range(WRITERS):
                    for k in range(KEYS_PER_WRITER):
                        key = f"w{w}-k{k:02}"
                        value = store.get(key)
                        if value is not None:
                            assert value.startswith(f"{key}=".encode()), (key, value)
                for key, value in store.scan(prefix="w1-"):
                    assert value.startswith(key + b"="), (key, value)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=reader)
    thread.start()
    return thread


def test_compaction_concurrent_with_writers_and_readers(tmp_path: Path, make_store: Any, h: Any) -> None:
    store = make_store(tmp_path / "s", partitions=3, inline_value_bytes=0, offset_map_bytes=256,
                       min_cleanable_dirty_ratio=0.2)
    model: dict[bytes, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()
    reader = run_reader(store, stop, errors)
    writers = run_writers(store, 240, errors, model, lock)
    rounds = 0
    while any(t.is_alive() for t in writers):
        report = store.compact(force=rounds % 3 == 0)
        assert not report.refused
        rounds += report.rounds
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert errors == []
    assert rounds > 0
    store.flush()
    assert dict(store.scan()) == model
    assert store.check() == []
    h.compact_until_clean(store, force=True)
    assert dict(store.scan()) == model
    records = h.log_records(store)
    assert sorted(k for _p, _o, k, _v in records) == sorted(model)  # one record per key is left
    assert store.check() == []


def test_background_compactor_with_writers(tmp_path: Path, make_store: Any) -> None:
    store = make_store(tmp_path / "s", partitions=2, background_compaction=True, compaction_interval_ms=10,
                       min_cleanable_dirty_ratio=0.1, inline_value_bytes=0)
    model: dict[bytes, bytes] = {}
    errors: list[BaseException] = []
    writers = run_writers(store, 300, errors, model, threading.Lock())
    for t in writers:
        t.join()
    store.flush()
    deadline = time.monotonic() + 30
    while store.stats()["compaction"]["rounds"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = store.stats()["compaction"]
    assert errors == []
    assert stats["background"] is True and stats["rounds"] > 0
    assert stats["last_error"] is None and stats["failing_partitions"] == {}
    assert dict(store.scan()) == model
    assert store.check() == []


# -- two compactors -------------------------------------------------------------------------------

def two_handles(tmp_path: Path, make_store: Any, **settings: Any) -> tuple[kvlog.Store, kvlog.Store]:
    path = tmp_path / "shared"
    first = make_store(path, producer_id=1, cache_dir=tmp_path / "cache-1", **settings)
    second = make_store(path, producer_id=2, cache_dir=tmp_path / "cache-2", **settings)
    return first, second


def data_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in (root / "data").rglob("*.arrow")}


def stored_as_data_files(root: Path, paths: set[str]) -> set[str]:
    """The paths among ``paths`` under ``data/``, once every one is checked to exist in ``root``
    (an inline file's path is its commit's, under ``log/``)."""
    assert all((root / path).is_file() for path in paths), sorted(p for p in paths if not (root / p).is_file())
    return {path for path in paths if path.startswith("data/")}


def live_files(store: kvlog.Store) -> set[str]:
    return set(store.log.snapshot(lambda r: [e.path for _f, e in r.iter_files()]))


def test_a_compactor_that_lost_the_race_is_refused_cleanly(
    tmp_path: Path, make_store: Any, h: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = two_handles(tmp_path, make_store, partitions=2)
    for i in range(40):
        first.put(f"k{i % 7}", f"v{i}")
    first.flush()
    second.refresh()
    before = h.log_records(second)

    # The second compactor plans, then the first one commits its job before the second commits.
    compactor = second._compactor
    assert compactor is not None
    won: list[kvlog.CompactionReport] = []
    original_plan = compactor.plan

    def plan_then_lose(now_ms: int, *, force: bool = False) -> Any:
        planned = original_plan(now_ms, force=force)
        won.append(first.compact())
        return planned

    monkeypatch.setattr(compactor, "plan", plan_then_lose)
    lost = second.compact()
    assert won[0].rounds == 1 and not won[0].refused
    assert lost.refused and lost.rounds == 0
    assert compactor.failures == {}
    monkeypatch.undo()

    # Nothing lost, nothing duplicated; the loser's outputs were deleted at once.
    for store in (first, second):
        store.refresh()
        assert h.log_records(store) == h.log_records(first)
        assert store.check() == []
    assert {k: v for _p, _o, k, v in h.log_records(first)} == {k: v for _p, _o, k, v in before}
    pending = set(first.log.snapshot(lambda r: [p for p, _d in r.iter_pending()]))
    shared = tmp_path / "shared"
    assert data_files(shared) == stored_as_data_files(shared, live_files(first) | pending)
    # The loser simply finds nothing left to do.
    assert second.compact().rounds == 0


def test_two_compactors_in_threads_never_lose_data(tmp_path: Path, make_store: Any, h: Any) -> None:
    first, second = two_handles(tmp_path, make_store, partitions=3, min_cleanable_dirty_ratio=0.0)
    model: dict[bytes, bytes | None] = {}
    outcomes = {"won": 0, "refused": 0, "idle": 0}
    for step in range(6):
        writer = first if step % 2 else second
        for i in range(30):
            key = f"k{(i * 7 + step) % 11}"
            if i % 10 == 3:
                writer.delete(key)
                model[key.encode()] = None
            else:
                writer.put(key, f"{step}-{i}")
                model[key.encode()] = f"{step}-{i}".encode()
        writer.flush()
        barrier = threading.Barrier(2)
        reports: list[kvlog.CompactionReport] = []
        errors: list[BaseException] = []

        def compact(store: kvlog.Store, barrier: threading.Barrier, reports: list[kvlog.CompactionReport],
                    errors: list[BaseException]) -> None:
            try:
                barrier.wait()
                reports.append(store.compact(force=True))
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        threads = [threading.Thread(target=compact, args=(s, barrier, reports, errors)) for s in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for report in reports:
            if report.refused:
                assert report.rounds == 0
                outcomes["refused"] += 1
            elif report.rounds:
                outcomes["won"] += 1
            else:
                outcomes["idle"] += 1
        assert 1 <= sum(r.rounds for r in reports) <= 2
        for store in (first, second):
            store.refresh()
            assert dict(store.scan()) == {k: v for k, v in model.items() if v is not None}
            assert store.check() == []
    assert outcomes["won"] >= 6


def test_two_compactor_objects_over_two_log_handles(tmp_path: Path, clock: ManualClock) -> None:
    root = tmp_path / "logs"
    config = StoreConfig(partitions=2, min_cleanable_dirty_ratio=0.0, background_compaction=False)
    logs = [open_log(LocalStorage(root, fsync=False), cache_dir=tmp_path / f"cache-{i}", partitions=2,
                     config=config, clock=clock) for i in range(2)]
    try:
        producer = logs[0].producer()
        sequences = {0: 0, 1: 0}
        for i in range(6):
            p = i % 2
            records = [(f"k{j % 4}".encode(), f"{i}-{j}".encode()) for j in range(8)]
            producer.append(p, records, base_sequence=sequences[p])
            sequences[p] += len(records)
        before = [[(r.offset, r.key, r.value) for r in logs[0].read(p)] for p in range(2)]
        winner, loser = (Compactor(log) for log in logs)
        now = clock.now_ms()
        logs[1].refresh()
        stale_plan, stale_batches = loser.plan(now)
        assert stale_plan is not None

        assert winner.run_once(now_ms=now).rounds == 1
        # The loser commits the job it planned before the winner's replace: refused, cleanly.
        refused = loser._run(stale_plan, stale_batches, now, kvlog.CompactionReport())
        assert refused.refused and refused.rounds == 0
        assert loser.failures == {}
        # Planning afresh, it finds the partitions clean.
        assert loser.run_once(now_ms=now).rounds == 0

        after = [[(r.offset, r.key, r.value) for r in log.read(p)] for p in range(2) for log in logs]
        assert after[0] == after[1] and after[2] == after[3]
        for p in range(2):
            latest = {k: (o, v) for o, k, v in before[p]}
            assert [(o, k, v) for k, (o, v) in sorted(latest.items(), key=lambda kv: kv[1][0])] == after[2 * p]
        live = set(logs[0].snapshot(lambda r: [e.path for _f, e in r.iter_files()]))
        pending = set(logs[0].snapshot(lambda r: [path for path, _d in r.iter_pending()]))
        assert data_files(root) == stored_as_data_files(root, live | pending)  # the loser deleted its outputs
    finally:
        for log in logs:
            log.close()


# -- the background compactor never dies silently -------------------------------------------------

def test_background_failures_are_reported_per_partition_and_retried(
    tmp_path: Path, make_store: Any, clock: ManualClock,
) -> None:
    faulty = FaultyStorage(LocalStorage(tmp_path / "s", fsync=False))
    # Data files of their own: the test fails the reads of the job's input data files.
    store = make_store(faulty, partitions=2, cache_dir=tmp_path / "cache", min_cleanable_dirty_ratio=0.0,
                       compaction_interval_ms=10, commit_inline_bytes=0)
    for i in range(20):
        store.put(f"k{i % 3}", str(i))
    store.flush()
    expected = dict(store.scan())
    # Reading the inputs fails: the first partition of the job fails, and keeps failing.
    faulty.set_plan(FaultPlan().fail("open_stream", "data/*", times=None))
    compactor = store._compactor
    assert compactor is not None
    compactor.start()
    try:
        deadline = time.monotonic() + 30
        while not store.stats()["compaction"]["failing_partitions"] and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = store.stats()["compaction"]
        assert stats["background"] is True
        failing = stats["failing_partitions"]
        assert len(failing) == 1
        (entry,) = failing.values()
        assert entry["failures"] >= 1 and "injected fault" in entry["error"]
        assert entry["retry_at_ms"] > clock.now_ms()
        assert stats["last_error"]

        # The fault clears; once the backoff has passed the partition is retried and recovers.
        faulty.set_plan(None)
        clock.advance(10 * 60_000)
        deadline = time.monotonic() + 30
        while store.stats()["compaction"]["rounds"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = store.stats()["compaction"]
        assert stats["rounds"] >= 1 and stats["failing_partitions"] == {}
        assert stats["background"] is True
    finally:
        compactor.stop()
    assert dict(store.scan()) == expected
    assert store.check() == []


def test_kvlog_compact_does_not_fence_a_running_application(
    tmp_path: Path, make_store: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from kvlog.cli import main

    path = tmp_path / "s"
    app = make_store(path, partitions=2)  # the store's own cache: the one the command opens too
    for i in range(10):
        app.put("key", str(i))
    app.flush()
    assert main(["compact", str(path), "--force"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rounds"], report["records_removed"]) == (1, 9)
    # The application keeps writing: the command took no producer over.
    app.put("key", "after")
    app.flush()
    assert app.get("key") == b"after"
    assert [r.value for r in app.changes()] == [b"9", b"after"]
    assert app.check() == []
