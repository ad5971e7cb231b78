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
