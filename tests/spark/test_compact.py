"""``spark_ext.compact``: exact dedup through Spark's shuffle, with the local compactor's rules.

Exactness is checked on the survivors themselves (no key twice in a partition's
cleaned range), retention on the tombstones' horizons, and interoperability by
compacting two copies of one store, one locally and one on Spark, and
comparing the surviving records offset by offset.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import kvlog
import spark_ext
from kvlog.compaction import Compactor

pytestmark = pytest.mark.spark

RETENTION_MS = 60_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _tombstone_horizons(kv: Any, store: kvlog.Store) -> dict[tuple[int, int], int | None]:
    """(partition, offset) of every surviving tombstone -> its batch's delete horizon."""
    horizons = {}
    by_partition: dict[int, list[dict[str, Any]]] = {}
    for b in kv.live_batches(store):
        by_partition.setdefault(b.partition, []).append(b)
    for r in store.changes():
        if r.value is None:
            batch = next(b for b in by_partition[r.partition] if b.base <= r.offset <= b.last)
            horizons[(r.partition, r.offset)] = batch.horizon_ms
    return horizons


def _latest_ops(kv: Any, store: kvlog.Store) -> dict[bytes, bytes | None]:
    """key -> its last value in the log (None: the last record is a tombstone)."""
    return {k: v for _p, _o, _t, k, v in kv.log_rows(store)}


def test_exact_and_same_retention_rules(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        model = kv.fill(store, ops=2000, keys=150, seed=21, delete_every=6)
        last_ops = _latest_ops(kv, store)
        records_before = len(kv.log_rows(store))
    deleted = {k for k, v in last_ops.items() if v is None}
    assert deleted and model
    t0 = _now_ms() + 1_000

    # Round 1: every superseded record goes; latest tombstones stay, stamped t0 + retention.
    report = spark_ext.compact(spark, path, force=True, now_ms=t0, delete_retention_ms=RETENTION_MS)
    assert report.rounds == 1 and not report.refused
    with kv.open_store(path, read_only=True) as store:
        rows = kv.log_rows(store)
        counts = Counter((p, k) for p, _o, _t, k, _v in rows)
        assert max(counts.values()) == 1, "a key survived twice in a partition"
        assert {k: v for _p, _o, _t, k, v in rows} == last_ops
        assert report.records_read == records_before
        assert report.records_written == len(rows)
        assert report.records_removed == records_before - len(rows)
        horizons = _tombstone_horizons(kv, store)
        assert len(horizons) == len(deleted)
        assert set(horizons.values()) == {t0 + RETENTION_MS}
        assert dict(store.scan()) == model
        assert store.check() == []
    # Nothing left to clean: a second compaction finds nothing to do.
    assert spark_ext.compact(spark, path, now_ms=t0 + 1, delete_retention_ms=RETENTION_MS).rounds == 0

    # Round 2, before the horizon: the tombstones stay, their horizon unchanged.
    report = spark_ext.compact(spark, path, force=True, now_ms=t0 + RETENTION_MS - 1,
                               delete_retention_ms=RETENTION_MS)
    assert report.rounds == 1 and report.tombstones_removed == 0
    with kv.open_store(path, read_only=True) as store:
        assert set(_tombstone_horizons(kv, store).values()) == {t0 + RETENTION_MS}
        assert len(_tombstone_horizons(kv, store)) == len(deleted)

    # Round 3, at the horizon: the planner finds the expired tombstones by itself and drops them.
    report = spark_ext.compact(spark, path, now_ms=t0 + RETENTION_MS, delete_retention_ms=RETENTION_MS)
    assert report.rounds == 1 and report.tombstones_removed == len(deleted)
    with kv.open_store(path, read_only=True) as store:
        rows = kv.log_rows(store)
        assert all(v is not None for *_rest, v in rows)
        assert {k: v for _p, _o, _t, k, v in rows} == model
        assert len(store) == len(model)
        assert store.check() == []


def test_local_and_spark_compaction_leave_the_same_survivors(spark: Any, kv: Any, tmp_path: Path) -> None:
    """Two copies of one store: local compaction (a map far larger than the keys) vs Spark."""
    local, remote = tmp_path / "local", tmp_path / "spark"
    settings = {"delete_retention_ms": RETENTION_MS, "offset_map_bytes": 8 << 20}
    with kv.open_store(local, **settings) as store:
        kv.fill(store, ops=1500, keys=200, seed=31, delete_every=5)
        # A first (local) round leaves clean prefixes, holes and stamped tombstones...
        store.compact(force=True, now_ms=_now_ms() + 1_000)
        # ... and more writes a dirty range above the cleaner checkpoints.
        kv.fill(store, ops=1500, keys=300, seed=32, delete_every=4)
    shutil.copytree(local, remote)

    def survivors(path: Path) -> tuple[dict[int, list[int]], list[Any], dict[Any, Any]]:
        with kv.open_store(path, read_only=True) as store:
            assert store.check() == []
            return kv.survivors_by_partition(store), kv.log_rows(store), _tombstone_horizons(kv, store)

    for now in (_now_ms() + 2_000, _now_ms() + 2_000 + RETENTION_MS):
        with kv.open_store(local, **settings) as store:
            local_report = store.compact(force=True, now_ms=now)
        spark_report = spark_ext.compact(spark, str(remote), force=True, now_ms=now, **settings)
        assert local_report.rounds == spark_report.rounds == 1
        assert not local_report.partial
        a, b = survivors(local), survivors(remote)
        assert a[0] == b[0], "different surviving offsets"
        assert a[1] == b[1], "different surviving records"
        assert a[2] == b[2], "different tombstone horizons"
        assert local_report.records_removed == spark_report.records_removed
        assert local_report.tombstones_removed == spark_report.tombstones_removed
        assert local_report.checkpoints == spark_report.checkpoints
    assert local_report.tombstones_removed > 0


def test_an_append_while_the_job_runs_is_not_an_input(spark: Any, kv: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends after planning are not the job's inputs: they stay live, and the replace commits."""
    path = str(tmp_path / "store")
    store = kv.open_store(path)
    try:
        model = kv.fill(store, ops=1000, keys=100, seed=45)
        ends: dict[int, int] = {}

        class AppendingCompactor(Compactor):
            def plan(self, now_ms: int, *, force: bool = False) -> Any:
                planned = super().plan(now_ms, force=force)
                ends.update({p: store.log.end_offset(p) for p in range(store.log.partitions)})
                kv.fill(store, ops=200, keys=150, seed=46, model=model)  # lands before Spark reads
                return planned

        monkeypatch.setattr(spark_ext.jobs, "Compactor", AppendingCompactor)
        report = spark_ext.compact(spark, path, force=True)
        assert not report.refused and report.rounds == 1 and report.records_removed > 0
        store.refresh()
        assert dict(store.scan()) == model
        rows = kv.log_rows(store)
        # Below the planned ends: compacted, one record per key; above: the 200 appends, untouched.
        assert len([r for r in rows if r[1] >= ends[r[0]]]) == 200
        below = Counter((r[0], r[3]) for r in rows if r[1] < ends[r[0]])
        assert max(below.values()) == 1
        assert store.check() == []
    finally:
        store.close()


def test_a_replace_whose_inputs_changed_is_refused(spark: Any, kv: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A local compaction lands between the Spark job's planning and its commit."""
    path = str(tmp_path / "store")
    store = kv.open_store(path)
    try:
        model = kv.fill(store, ops=1000, keys=100, seed=41)
        state: dict[str, Any] = {}

        class RacingCompactor(Compactor):
            def plan(self, now_ms: int, *, force: bool = False) -> Any:
                planned = super().plan(now_ms, force=force)
                state["local"] = store.compact(force=True)
                state["files"] = kv.data_files_on_disk(path)
                state["rows"] = kv.log_rows(store)
                return planned

        monkeypatch.setattr(spark_ext.jobs, "Compactor", RacingCompactor)
        report = spark_ext.compact(spark, path, force=True)
        assert state["local"].rounds == 1
        assert report.refused and report.rounds == 0
        # The store is exactly what the local compaction left; the refused outputs are gone.
        assert kv.data_files_on_disk(path) == state["files"]
        assert kv.log_rows(store) == state["rows"]
        assert dict(store.scan()) == model
        assert store.check() == []
        # A later Spark compaction of the same store works.
        monkeypatch.undo()
        store.put("after", "race", sync=True)
        again = spark_ext.compact(spark, path, force=True)
        assert again.rounds == 1 and not again.refused
        model[b"after"] = b"race"
        assert dict(store.scan()) == model
        assert store.check() == []
    finally:
        store.close()
