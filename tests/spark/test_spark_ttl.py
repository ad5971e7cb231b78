"""Time to live on Spark: the log view's ``expires_ms``, the latest view hiding expired records
at the job's time, Spark compaction removing them under the local cleaner's rule, and a bulk
index rebuild keeping each entry's expiry."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import kvlog
import spark_ext

pytestmark = pytest.mark.spark

RETENTION_MS = 1000
T0 = 1_700_000_000_000


def _build(kv: Any, path: Path) -> None:
    """k1: an old value then an expiring one (expires T0 + 100); k2 expires T0 + 10 s; a, b last."""
    clock = kvlog.ManualClock(T0)
    with kv.open_store(path, clock=clock) as store:
        store.put(b"k1", b"old", sync=True)
        store.put(b"a", b"1")
        store.put(b"k1", b"new", ttl_ms=100)
        store.put(b"k2", b"x" * 3000, ttl_ms=10_000)
        store.put(b"b", b"2", sync=True)


def _read(spark: Any, path: Path, **options: str) -> Any:
    reader = spark.read.format("kvlog")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(path))


def test_views_show_and_hide_expiries(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = tmp_path / "store"
    _build(kv, path)
    log = {(bytes(r["key"]), bytes(r["value"])): r["expires_ms"] for r in _read(spark, path).collect()}
    assert log == {(b"k1", b"old"): None, (b"a", b"1"): None, (b"k1", b"new"): T0 + 100,
                   (b"k2", b"x" * 3000): T0 + 10_000, (b"b", b"2"): None}

    def latest(now: int) -> dict[bytes, tuple[bytes, Any]]:
        rows = _read(spark, path, view="latest", now_ms=str(now)).collect()
        return {bytes(r["key"]): (bytes(r["value"])[:3], r["expires_ms"]) for r in rows}

    assert latest(T0) == {b"a": (b"1", None), b"b": (b"2", None), b"k1": (b"new", T0 + 100),
                          b"k2": (b"xxx", T0 + 10_000)}
    # Expired at the job's time: hidden, and the older value of k1 never shows instead.
    assert latest(T0 + 100) == {b"a": (b"1", None), b"b": (b"2", None), b"k2": (b"xxx", T0 + 10_000)}
    assert latest(T0 + 10_000) == {b"a": (b"1", None), b"b": (b"2", None)}


def test_spark_compaction_removes_expired_records_as_the_local_cleaner(spark: Any, kv: Any,
                                                                        tmp_path: Path) -> None:
    path, local = tmp_path / "store", tmp_path / "local"
    _build(kv, path)
    shutil.copytree(path, local)
    now = T0 + 200
    first = spark_ext.compact(spark, str(path), force=True, now_ms=now, delete_retention_ms=RETENTION_MS)
    assert first.rounds == 1 and first.expired_removed == 0 and first.records_removed == 1
    second = spark_ext.compact(spark, str(path), force=True, now_ms=now + RETENTION_MS,
                               delete_retention_ms=RETENTION_MS)
    assert second.expired_removed == 1
    clock = kvlog.ManualClock(now)
    with kv.open_store(local, clock=clock, delete_retention_ms=RETENTION_MS) as store:
        assert store.compact(force=True).records_removed == 1
        clock.advance(RETENTION_MS)
        assert store.compact(force=True).expired_removed == 1
        local_survivors = kv.survivors_by_partition(store)
    clock = kvlog.ManualClock(now + RETENTION_MS)
    with kv.open_store(path, clock=clock) as store:
        assert kv.survivors_by_partition(store) == local_survivors
        assert sorted(r.key for r in store.changes()) == [b"a", b"b", b"k2"]
        assert dict(store.scan()) == {b"a": b"1", b"b": b"2", b"k2": b"x" * 3000}
        assert store.get(b"k1") is None and store.check() == []
        clock.set(T0 + 10_000)
        assert dict(store.scan()) == {b"a": b"1", b"b": b"2"} and len(store) == 2


def test_a_rebuilt_index_keeps_each_entrys_expiry(spark: Any, kv: Any, tmp_path: Path) -> None:
    path, cache = tmp_path / "store", tmp_path / "rebuilt"
    _build(kv, path)
    result = spark_ext.rebuild_index(spark, str(path), cache)
    assert result["keys"] == 4  # expired or not, each key's latest record has its entry
    clock = kvlog.ManualClock(T0 + 50)
    with kvlog.open(str(path), cache_dir=str(cache), read_only=True, clock=clock) as store:
        assert store.get(b"k1") == b"new" and len(store) == 4
        clock.set(T0 + 100)
        assert store.get(b"k1") is None and len(store) == 3
        clock.set(T0 + 10_000)
        assert dict(store.scan()) == {b"a": b"1", b"b": b"2"} and len(store) == 2
