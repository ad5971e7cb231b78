"""Append writes through the data source: ``df.write.format("kvlog").mode("append").save(uri)``.

Each Spark task is an idempotent producer and the driver makes every task's
file live in one commit; bad input fails the whole write and commits nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import kvlog

pytestmark = pytest.mark.spark


def _write(df: Any, uri: str, mode: str = "append") -> None:
    df.write.format("kvlog").mode(mode).save(uri)


def test_append_binary_and_string_columns_with_deletes(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        model = kv.fill(store, ops=300, keys=80, seed=11)
        version = store.log.version
        # Binary keys and values; a null value deletes. Two input partitions -> two tasks.
        rows = [(b"key-%05d" % i, None if i % 4 == 0 else b"bin-%d" % i) for i in range(0, 80, 2)]
        df = spark.createDataFrame(rows, "key binary, value binary").repartition(2)
        ends = {p: store.log.end_offset(p) for p in range(store.log.partitions)}
        started_ms = time.time_ns() // 1_000_000
        _write(df, path)
        finished_ms = time.time_ns() // 1_000_000
        for key, value in rows:
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        # The open store sees the append once it refreshes (it does so every refresh_interval_ms
        # by itself); its own key index took the commit.
        assert store.refresh() == version + 1, "the write was not one commit"
        assert {k: store.get(k) for k in model} == model
        assert all(store.get(k) is None for k, v in rows if v is None)
        # Records are stamped with the time they were written, as a put stamps them.
        appended = [r for r in store.changes() if r.offset >= ends[r.partition]]
        assert sorted((r.key, r.value) for r in appended) == sorted(rows)
        assert all(started_ms <= r.timestamp_ms <= finished_ms for r in appended)
        # String columns are stored as UTF-8.
        text = spark.createDataFrame([(f"naïve-{i}", f"välue-{i}") for i in range(20)] + [("key-00001", None)],
                                     "key string, value string")
        _write(text, path)
        store.refresh()
        for i in range(20):
            model[f"naïve-{i}".encode()] = f"välue-{i}".encode()
        model.pop(b"key-00001", None)
        assert store.get("naïve-7") == "välue-7".encode()
        assert store.get("key-00001") is None
        assert len(store) == len(model)
        assert dict(store.scan()) == model
        assert store.check() == []
    # A fresh open (the key index from the cache) agrees as well.
    with kvlog.open(path, read_only=True) as again:
        assert dict(again.scan()) == model
        assert again.check() == []


def test_a_retried_task_never_duplicates(spark: Any, kv: Any, tmp_path: Path) -> None:
    """Task 1 fails on its first attempt (local[2,2] allows one retry); every key lands once."""
    from pyspark import TaskContext

    path = str(tmp_path / "store")
    marker = tmp_path / "first-attempt-failed"
    with kv.open_store(path) as store:
        store.put("before", "x", sync=True)
    keys = [b"retry-%05d" % i for i in range(400)]
    df = spark.createDataFrame([(k, b"v-" + k) for k in keys], "key binary, value binary").repartition(2, "key")
    marker_path = str(marker)

    def fail_once(batches: Any) -> Any:
        context = TaskContext.get()
        for batch in batches:
            yield batch
            if context.partitionId() == 1 and context.attemptNumber() == 0:
                open(marker_path, "w").close()
                raise RuntimeError("injected failure of the first attempt")

    flaky = df.mapInArrow(fail_once, df.schema)
    _write(flaky, path)
    assert marker.exists(), "the injected failure never happened"
    with kvlog.open(path, read_only=True) as store:
        counts = Counter(r.key for r in store.changes())
        assert {k: counts[k] for k in keys} == {k: 1 for k in keys}
        assert counts[b"before"] == 1
        assert sum(counts.values()) == len(keys) + 1
        assert all(store.get(k) == b"v-" + k for k in keys)
        assert store.check() == []


def _unchanged(kv: Any, path: str, version: int, files: set[str], model: dict[bytes, bytes]) -> None:
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == version
        assert kv.live_files(store) == files
        assert dict(store.scan()) == model
        assert store.check() == []


def test_bad_input_commits_nothing(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        model = kv.fill(store, ops=100, keys=30, seed=12)
        version = store.log.version
        files = kv.live_files(store)
    # No `key` column: refused on the driver, before any task runs.
    no_key = spark.createDataFrame([(b"a", b"1")], "k binary, value binary")
    with pytest.raises(Exception, match="InvalidRecordError") as caught:
        _write(no_key, path)
    assert "'key' column" in str(caught.value)
    _unchanged(kv, path, version, files, model)
    # A null key in one task: the whole write fails (after the retry) and nothing is committed,
    # not even the other task's valid rows.
    good = [(b"fine-%03d" % i, b"v") for i in range(50)]
    bad = spark.createDataFrame(good + [(None, b"orphan")], "key binary, value binary").repartition(2)
    with pytest.raises(Exception, match="may not be null"):
        _write(bad, path)
    _unchanged(kv, path, version, files, model)
    # Keys and values must be binary or string.
    numbers = spark.createDataFrame([(1, b"v")], "key int, value binary")
    with pytest.raises(Exception, match="binary or string"):
        _write(numbers, path)
    _unchanged(kv, path, version, files, model)
    # Overwrite with a null key: refused the same way.
    with pytest.raises(Exception, match="may not be null"):
        _write(bad, path, mode="overwrite")
    _unchanged(kv, path, version, files, model)


def _no_task_runs(df: Any, marker: Path) -> Any:
    """``df`` passed through a task that leaves ``marker`` behind: proof that some task ran."""
    marker_path = str(marker)

    def touch(batches: Any) -> Any:
        open(marker_path, "w").close()
        yield from batches

    return df.mapInArrow(touch, df.schema)


def _store_with_data(kv: Any, path: str) -> tuple[int, set[str], dict[bytes, bytes], set[str]]:
    with kv.open_store(path) as store:
        model = kv.fill(store, ops=120, keys=40, seed=13)
        return store.log.version, kv.live_files(store), model, kv.data_files_on_disk(path)


def test_a_dataframe_without_a_value_column_deletes_nothing(spark: Any, kv: Any, tmp_path: Path) -> None:
    """Only keys (no ``value`` column) is refused on the driver: it must not become a tombstone per key."""
    path = str(tmp_path / "store")
    version, files, model, on_disk = _store_with_data(kv, path)
    marker = tmp_path / "a-task-ran"
    keys_only = spark.createDataFrame([(k,) for k in model], "key binary")
    with pytest.raises(Exception, match="InvalidRecordError") as caught:
        _write(_no_task_runs(keys_only, marker), path)
    message = str(caught.value)
    assert "no 'value' column" in message and "null deletes" in message, message
    assert not marker.exists(), "a task ran before the schema was refused"
    _unchanged(kv, path, version, files, model)
    assert kv.data_files_on_disk(path) == on_disk


@pytest.mark.parametrize(("schema", "row", "problem"), [
    ("key binary, value binary, extra string", (b"k", b"v", "x"), "unknown column 'extra'"),
    ("key binary, value binary, timestamp_ms bigint", (b"k", b"v", 1), "unknown column 'timestamp_ms'"),
    ("value binary", (b"v",), "no 'key' column"),
    ("key int, value binary", (1, b"v"), "'key' is int"),
    ("key string, value double", ("k", 1.5), "'value' is double"),
    ("key string, value array<binary>", ("k", [b"v"]), "'value' is array<binary>"),
    ("key string, value string, timestamp string", ("k", "v", "1"), "'timestamp' is string"),
    ("key string, value string, timestamp int", ("k", "v", 1), "'timestamp' is int"),
])
def test_a_bad_schema_is_refused_before_any_task_runs(spark: Any, kv: Any, tmp_path: Path, schema: str,
                                                      row: tuple[Any, ...], problem: str) -> None:
    path = str(tmp_path / "store")
    version, files, model, on_disk = _store_with_data(kv, path)
    marker = tmp_path / "a-task-ran"
    df = spark.createDataFrame([row], schema)
    with pytest.raises(Exception, match="InvalidRecordError") as caught:
        _write(_no_task_runs(df, marker), path)
    message = str(caught.value)
    assert problem in message, message
    assert "'key'" in message and "'value'" in message and "binary or string" in message, message
    assert not marker.exists(), "a task ran before the schema was refused"
    _unchanged(kv, path, version, files, model)
    assert kv.data_files_on_disk(path) == on_disk


def test_a_timestamp_column_stamps_the_records(spark: Any, kv: Any, tmp_path: Path) -> None:
    """The optional ``timestamp`` column (bigint milliseconds, as the read views have it) is kept."""
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        store.put(b"old", b"x", sync=True)
    df = spark.createDataFrame([("t1", "v1", 1234), ("old", None, 5678)], "key string, value string, timestamp bigint")
    _write(df, path)
    with kvlog.open(path, read_only=True) as store:
        stamped = {r.key: (r.value, r.timestamp_ms) for r in store.changes() if r.timestamp_ms in (1234, 5678)}
        assert stamped == {b"t1": (b"v1", 1234), b"old": (None, 5678)}
        assert dict(store.scan()) == {b"t1": b"v1"}
