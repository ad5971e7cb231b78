"""``spark_ext.materialize`` (the latest state as Parquet) and ``spark_ext.rebuild_index``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import kvlog
import spark_ext

pytestmark = pytest.mark.spark


def _build(kv: Any, path: Path, **settings: Any) -> tuple[dict[bytes, bytes], dict[bytes, tuple[int, int, int]]]:
    """A store with overwrites, deletes, a local compaction (holes) and writes after it."""
    with kv.open_store(path, **settings) as store:
        model = kv.fill(store, ops=1500, keys=250, seed=51, delete_every=5)
        store.compact(force=True)
        kv.fill(store, ops=800, keys=400, seed=52, delete_every=6, model=model)
        store.put(b"big", b"v" * 5000)  # larger than the inline limit of the key index
        model[b"big"] = b"v" * 5000
        store.flush()
        where: dict[bytes, tuple[int, int, int]] = {}
        for r in store.changes():
            if r.value is None:
                where.pop(r.key, None)
            else:
                where[r.key] = (r.partition, r.offset, r.timestamp_ms)
        assert store.check() == []
    return model, where


def test_materialize_writes_the_latest_state(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = tmp_path / "store"
    model, where = _build(kv, path)
    out = tmp_path / "latest.parquet"
    result = spark_ext.materialize(spark, str(path), str(out))
    assert result["rows"] == len(model)
    assert result["columns"] == ["key", "value", "partition", "offset", "timestamp", "expires_ms"]
    table = pq.read_table(out)
    rows = kv.table_rows(table, ["key", "value", "partition", "offset", "timestamp"])
    assert len(rows) == len({r[0] for r in rows})
    assert {r[0]: r[1] for r in rows} == model
    assert {r[0]: (r[2], r[3], r[4]) for r in rows} == where
    # Materializing again replaces the table (mode="overwrite").
    with kv.open_store(path) as store:
        store.delete(b"big", sync=True)
    del model[b"big"]
    assert spark_ext.materialize(spark, str(path), str(out))["rows"] == len(model)
    assert {bytes(k): bytes(v) for k, v in zip(*pq.read_table(out, columns=["key", "value"]).columns,
                                                 strict=True)} == model


def test_rebuild_index_gives_a_ready_cache(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = tmp_path / "store"
    # data files of their own: the test tells a replay by its ranged reads of data files
    model, _where = _build(kv, path, commit_inline_bytes=0)
    cache = tmp_path / "rebuilt-cache"
    result = spark_ext.rebuild_index(spark, str(path), cache)
    assert result["keys"] == len(model)
    with kvlog.open(str(path), cache_dir=str(cache), read_only=True) as store:
        requests = dict(store.log.storage.requests)
        # Opening replayed no data: no data file was read (a replay reads every live batch).
        assert requests.get("range_get", 0) == 0 and requests.get("stream", 0) == 0, requests
        assert len(store) == len(model)
        assert {k: store.get(k) for k in model} == model
        assert store.get(b"never-written") is None
        assert list(store.scan()) == sorted(model.items())
        assert list(store.scan(prefix=b"key-001")) == sorted(
            (k, v) for k, v in model.items() if k.startswith(b"key-001"))
        assert list(store.scan(reverse=True))[:5] == sorted(model.items(), reverse=True)[:5]
        assert store.check() == []
        # Values above the inline limit are read from their batch: one ranged read each.
        assert store.get(b"big") == b"v" * 5000
    # The same, compared with a cache that kvlog builds by replaying the data itself.
    with kvlog.open(str(path), cache_dir=str(tmp_path / "replayed"), read_only=True) as replayed:
        assert replayed.log.storage.requests.get("range_get", 0) > 0
        assert len(replayed) == len(model)
