"""Spark compaction under attack: a retried task, a refused commit after the outputs are written,
expiries at the horizon boundary, and a partition whose records all go.

Each result is compared with the local compactor's on a copy of the same store (same
surviving offsets, same delete horizons), and the data directory with the live files (no
output a failed attempt or a refused commit wrote is left behind).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import kvlog
import spark_ext
from spark_ext.compaction import RewriteTask

pytestmark = pytest.mark.spark

RETENTION_MS = 1000
T0 = 1_700_000_000_000


def _state(kv: Any, path: Path, now: int) -> tuple[dict[int, list[int]], list[tuple[int, int, int | None]]]:
    """(surviving offsets by partition, (partition, last offset, horizon) of every live batch)."""
    with kv.open_store(path, read_only=True, clock=kvlog.ManualClock(now)) as store:
        assert store.check() == []
        batches = [(b.partition, b.last, b.horizon_ms) for b in kv.live_batches(store)]
        return kv.survivors_by_partition(store), batches


def _spark(spark: Any, kv: Any, path: Path, **options: Any) -> kvlog.CompactionReport:
    """``spark_ext.compact``, checking that every data file it left is live."""
    before = kv.data_files_on_disk(path)
    report = spark_ext.compact(spark, str(path), **options)
    with kv.open_store(path, read_only=True) as store:
        assert kv.data_files_on_disk(path) - before <= kv.live_files(store), "an output was left behind"
    return report


def _local(kv: Any, path: Path, now: int) -> kvlog.CompactionReport:
    with kv.open_store(path, clock=kvlog.ManualClock(now), delete_retention_ms=RETENTION_MS) as store:
        return store.compact(force=True)


def test_a_retried_task_commits_one_attempts_outputs(spark: Any, kv: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "store"
    with kv.open_store(path) as store:
        model = kv.fill(store, ops=600, keys=80, seed=51)

    class FailingOnce(RewriteTask):
        """The first attempt of every task writes its outputs, then fails (defined here, so that
        Spark ships the class itself to its workers)."""

        def __call__(self, ids: Any) -> Any:
            from pyspark import TaskContext

            results = list(super().__call__(ids))
            if TaskContext.get().attemptNumber() == 0:
                raise RuntimeError("the first attempt dies after writing its outputs")
            yield from results

    monkeypatch.setattr(spark_ext.jobs, "RewriteTask", FailingOnce)
    report = _spark(spark, kv, path, force=True)
    assert report.rounds == 1 and not report.refused and report.records_removed > 0
    assert report.duration_s > 0 and report.files_out >= 1 and report.bytes_written > 0
    _state(kv, path, T0)
    with kv.open_store(path, read_only=True) as store:
        assert dict(store.scan()) == model
        assert len(kv.log_rows(store)) == report.records_written


def test_a_commit_refused_after_the_outputs_are_written_leaves_nothing(
        spark: Any, kv: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local compaction lands after stage 1, while the rewrite runs: the commit is refused."""
    path = tmp_path / "store"
    store = kv.open_store(path)
    try:
        model = kv.fill(store, ops=600, keys=80, seed=52)
        state: dict[str, Any] = {}
        first_stage = spark_ext.jobs.stage_one

        def racing(*args: Any) -> Any:
            found = first_stage(*args)
            state["local"] = store.compact(force=True)
            state["files"] = kv.data_files_on_disk(path)
            state["rows"] = kv.log_rows(store)
            return found

        monkeypatch.setattr(spark_ext.jobs, "stage_one", racing)
        report = spark_ext.compact(spark, str(path), force=True)
        assert state["local"].rounds == 1
        assert report.refused and report.rounds == 0 and report.duration_s > 0
        assert kv.data_files_on_disk(path) == state["files"]
        assert kv.log_rows(store) == state["rows"]
        assert dict(store.scan()) == model and store.check() == []
    finally:
        store.close()


@pytest.mark.slow
def test_expiries_and_tombstones_at_the_horizon_boundary_as_the_local_cleaner(
        spark: Any, kv: Any, tmp_path: Path) -> None:
    """Records expiring at T0 + 100 and a tombstone, compacted one millisecond before and at
    each boundary (expiry, then delete horizon), on Spark and locally."""
    path, local = tmp_path / "spark", tmp_path / "local"
    with kv.open_store(path, clock=kvlog.ManualClock(T0)) as store:
        store.put(b"gone", b"old", sync=True)
        store.put(b"e1", b"v", ttl_ms=100)
        store.put(b"e2", b"w", ttl_ms=100)
        store.put(b"keep", b"k")
        store.delete(b"gone")
        store.put(b"e1", b"again", ttl_ms=100, sync=True)
    shutil.copytree(path, local)
    expiry = T0 + 100
    for now in (expiry - 1, expiry, expiry + RETENTION_MS - 1, expiry + RETENTION_MS):
        ours = _spark(spark, kv, path, force=True, now_ms=now, delete_retention_ms=RETENTION_MS)
        theirs = _local(kv, local, now)
        assert ours.rounds == theirs.rounds == 1, now
        assert _state(kv, path, now) == _state(kv, local, now), now
        assert (ours.records_removed, ours.tombstones_removed, ours.expired_removed) == (
            theirs.records_removed, theirs.tombstones_removed, theirs.expired_removed), now
        assert ours.checkpoints == theirs.checkpoints
    with kv.open_store(path, read_only=True, clock=kvlog.ManualClock(expiry + RETENTION_MS)) as store:
        assert sorted(r.key for r in store.changes()) == [b"keep"]


@pytest.mark.slow
def test_a_partition_whose_records_all_go(spark: Any, kv: Any, tmp_path: Path) -> None:
    path, local = tmp_path / "spark", tmp_path / "local"
    with kv.open_store(path, clock=kvlog.ManualClock(T0)) as store:
        keys = [b"k%03d" % i for i in range(60)]
        for k in keys:
            store.put(k, b"v")
        store.flush()
        partition_of = {r.key: r.partition for r in store.changes()}
        for k in keys:
            if partition_of[k] == 0:
                store.delete(k)
        store.flush()
    shutil.copytree(path, local)
    for now in (T0 + 10, T0 + 10 + RETENTION_MS):
        ours = _spark(spark, kv, path, force=True, now_ms=now, delete_retention_ms=RETENTION_MS)
        theirs = _local(kv, local, now)
        assert _state(kv, path, now) == _state(kv, local, now)
        assert ours.records_removed == theirs.records_removed
    survivors, batches = _state(kv, path, now)
    assert survivors[0] == [] and not [b for b in batches if b[0] == 0]
    assert survivors[1] and ours.checkpoints == theirs.checkpoints
    with kv.open_store(path) as store:
        store.put(b"after", b"x", sync=True)  # the emptied partition takes appends again
        assert store.get(b"after") == b"x" and store.check() == []
