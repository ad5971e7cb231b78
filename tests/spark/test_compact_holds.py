"""``spark_ext.compact`` keeps the tombstones a consumer group holds, as the local compactor
does: every tombstone at or after a holding group's committed offset stays past its delete
horizon, those below it go, and deleting the group lets the next rounds remove the rest."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import kvlog
import spark_ext

pytestmark = pytest.mark.spark

RETENTION_MS = 60_000


def test_spark_compaction_keeps_what_a_lagging_group_holds(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kvlog.open(path, partitions=2, background_compaction=False, flush_interval_ms=0) as store:
        for i in range(60):
            store.put(f"k{i:02d}", f"v{i}")
        store.flush()
        for i in range(0, 60, 2):
            store.delete(f"k{i:02d}")
        store.flush()
        # The group has read every put and half of each partition's deletes.
        tombstones = {p: [r.offset for r in store.changes(p) if r.value is None] for p in range(2)}
        held_from = {p: offsets[len(offsets) // 2] for p, offsets in tombstones.items()}
        consumer = store.consumer("lagging", hold_tombstones=True)
        consumer.commit(held_from)
    held = sum(1 for p, offsets in tombstones.items() for o in offsets if o >= held_from[p])
    t0 = time.time_ns() // 1_000_000 + 1_000
    settings: dict[str, Any] = {"delete_retention_ms": RETENTION_MS}
    first = spark_ext.compact(spark, path, force=True, now_ms=t0, **settings)
    assert first.rounds == 1 and first.tombstones_removed == 0  # stamped: now + retention
    second = spark_ext.compact(spark, path, force=True, now_ms=t0 + RETENTION_MS, **settings)
    assert second.rounds == 1
    assert second.tombstones_removed == sum(len(o) for o in tombstones.values()) - held
    with kvlog.open(path, read_only=True) as reader:
        kept = [r for p in range(2) for r in reader.changes(p) if r.value is None]
        assert sorted((r.partition, r.offset) for r in kept) == sorted(
            (p, o) for p, offsets in tombstones.items() for o in offsets if o >= held_from[p])
        lagging = reader.consumer("lagging")
        deletes = [r for r in lagging.poll(timeout_s=0, max_records=10_000) if r.value is None]
        assert len(deletes) == held  # every delete it has not read yet
    with kvlog.open(path, background_compaction=False) as store:
        store.delete_group("lagging")
    # The held tombstones were stamped again by the second round: they go a retention later.
    third = spark_ext.compact(spark, path, force=True, now_ms=t0 + 2 * RETENTION_MS + 1, **settings)
    assert third.tombstones_removed == held


def test_a_hold_that_starts_while_a_spark_job_runs_refuses_its_commit(spark: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A group read ``a`` and committed without a hold; ``a`` was deleted and the tombstone's
    horizon has passed. A Spark job plans (no hold: it removes the tombstone); the group starts
    holding before the job commits. The job's ``replace`` must be refused (and its outputs
    deleted), so the group still reads the delete."""
    import spark_ext.jobs as jobs

    path = str(tmp_path / "store")
    with kvlog.open(path, partitions=1, background_compaction=False, flush_interval_ms=0) as store:
        store.put("a", "1")
        store.flush()
        plain = store.consumer("g")
        assert [r.key for r in plain.poll(timeout_s=0)] == [b"a"]
        plain.commit()
        store.delete("a")
        store.flush()
    t0 = time.time_ns() // 1_000_000 + 1_000
    settings: dict[str, Any] = {"delete_retention_ms": RETENTION_MS}
    assert spark_ext.compact(spark, path, force=True, now_ms=t0, **settings).tombstones_removed == 0
    original = jobs.commit_files

    def hold_first(*args: Any, **kwargs: Any) -> Any:
        with kvlog.open(path, background_compaction=False) as writer:
            writer.consumer("g", hold_tombstones=True).close()
        return original(*args, **kwargs)

    monkeypatch.setattr(jobs, "commit_files", hold_first)
    report = spark_ext.compact(spark, path, force=True, now_ms=t0 + RETENTION_MS, **settings)
    assert report.refused
    monkeypatch.setattr(jobs, "commit_files", original)
    with kvlog.open(path, background_compaction=False) as store:
        assert store.check() == []
        assert [(r.key, r.value) for r in store.consumer("g").poll(timeout_s=0)] == [(b"a", None)]
        data = {p.name for p in (tmp_path / "store" / "data").rglob("*.arrow")}
        live = {Path(entry.path).name for _id, entry in store.log.snapshot(lambda r: list(r.iter_files()))}
        assert data == live  # the refused job's outputs are gone
    # The next job plans with the hold: the tombstone stays.
    again = spark_ext.compact(spark, path, force=True, now_ms=t0 + 2 * RETENTION_MS, **settings)
    assert not again.refused and again.tombstones_removed == 0
