"""view=latest split into key-hash shares: the same answer as one task per partition, each key
once; a bad ``latest_split_bytes`` is refused when the read is planned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlog

pytestmark = pytest.mark.spark

COLUMNS = ["key", "value", "partition", "offset", "timestamp", "expires_ms"]
T0 = 1_700_000_000_000


def _latest(spark: Any, path: Path, **options: str) -> Any:
    reader = spark.read.format("kvlog").option("view", "latest").option("now_ms", str(T0 + 50))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(path))


def test_shares_give_the_one_task_answer(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = tmp_path / "store"
    with kv.open_store(path, clock=kvlog.ManualClock(T0)) as store:
        model = kv.fill(store, ops=800, keys=120, seed=61, delete_every=5)
        store.compact(force=True)  # holes: batches with a bitmap of present offsets
        kv.fill(store, ops=300, keys=150, seed=62, model=model)
        store.put(b"short", b"lived", ttl_ms=10)  # expired at the read's now_ms
        store.put(b"long", b"lived", ttl_ms=10_000, sync=True)
        model[b"long"] = b"lived"
        sizes = [sum(b.length for b in kv.live_batches(store) if b.partition == p) for p in range(4)]
    whole = _latest(spark, path)
    split = _latest(spark, path, latest_split_bytes=str(max(sizes) // 3))
    assert whole.rdd.getNumPartitions() == 4
    assert 8 <= split.rdd.getNumPartitions() <= 16
    rows = sorted(kv.table_rows(split.toArrow(), COLUMNS))
    assert rows == sorted(kv.table_rows(whole.toArrow(), COLUMNS))
    assert len(rows) == len({r[0] for r in rows}) == len(model)
    assert {r[0]: r[1] for r in rows} == model


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_a_bad_split_size_is_refused(spark: Any, kv: Any, tmp_path: Path, value: str) -> None:
    path = tmp_path / "store"
    with kv.open_store(path) as store:
        store.put(b"k", b"v", sync=True)
    with pytest.raises(Exception, match="option latest_split_bytes must be a positive integer"):
        _latest(spark, path, latest_split_bytes=value).collect()
