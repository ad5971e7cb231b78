"""Spark's save modes on kvlog: append creating the store, overwrite with tombstones,
errorifexists and ignore through :func:`spark_ext.save`, and catalog tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlog
import spark_ext
from kvlog.format.commit import decode_commit
from kvlog.log.naming import commit_name

pytestmark = pytest.mark.spark


def _df(spark: Any, rows: list[tuple[Any, ...]], schema: str = "key string, value string") -> Any:
    return spark.createDataFrame(rows, schema).repartition(2)


def _state(path: str) -> dict[bytes, bytes]:
    with kvlog.open(path, read_only=True) as store:
        assert store.check() == []
        return dict(store.scan())


def _replayed(path: str) -> dict[bytes, bytes]:
    """The latest state as a changelog reader folds it from ``store.changes()``."""
    out: dict[bytes, bytes] = {}
    with kvlog.open(path, read_only=True) as store:
        for record in store.changes():
            if record.value is None:
                out.pop(record.key, None)
            else:
                out[record.key] = record.value
    return out


def _snapshot(kv: Any, path: str) -> tuple[int, set[str], dict[bytes, bytes]]:
    with kvlog.open(path, read_only=True) as store:
        return store.log.version, kv.data_files_on_disk(path), dict(store.scan())


def test_append_creates_a_missing_store_with_its_partitions(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "new" / "store")
    _df(spark, [("a", "1"), ("b", "2")]).write.format("kvlog").mode("append").option("partitions", "3").save(path)
    with kvlog.open(path, read_only=True) as store:
        assert store.log.partitions == 3 and dict(store.scan()) == {b"a": b"1", b"b": b"2"}
        version = store.log.version
    # Appending again adds; a partitions option that disagrees is refused before anything is written.
    _df(spark, [("c", "3")]).write.format("kvlog").mode("append").save(path)
    assert _state(path) == {b"a": b"1", b"b": b"2", b"c": b"3"}
    with pytest.raises(Exception, match="partitions=5 but the store") as caught:
        _df(spark, [("d", "4")]).write.format("kvlog").mode("append").option("partitions", "5").save(path)
    assert "ConfigError" in str(caught.value)
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == version + 1
    # Without the option a new store has the store default; a bad value is refused.
    other = str(tmp_path / "other")
    _df(spark, [("a", "1")]).write.format("kvlog").mode("append").save(other)
    with kvlog.open(other, read_only=True) as store:
        assert store.log.partitions == kvlog.StoreConfig().partitions
    for bad in ("many", "0"):
        with pytest.raises(Exception, match="partitions"):
            _df(spark, [("a", "1")]).write.format("kvlog").mode("append").option("partitions", bad) \
                .save(str(tmp_path / f"bad-{bad}"))
        assert not (tmp_path / f"bad-{bad}").exists()


def test_a_store_is_never_created_in_an_unrelated_directory(spark: Any, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    for mode in ("append", "overwrite"):
        with pytest.raises(Exception, match="is not empty and is not a kvlog store"):
            _df(spark, [("a", "1")]).write.format("kvlog").mode(mode).save(str(busy))
    with pytest.raises(kvlog.ConfigError, match="is not empty"):
        spark_ext.save(_df(spark, [("a", "1")]), str(busy))
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    _df(spark, [("a", "1")]).write.format("kvlog").mode("append").save(str(empty))
    assert _state(str(empty)) == {b"a": b"1"}


def test_overwrite_is_one_commit_with_a_tombstone_per_absent_key(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=200, keys=60, seed=21)
        before = dict(store.scan())
        version = store.log.version
        ends = {p: store.log.end_offset(p) for p in range(store.log.partitions)}
    keep = sorted(before)[::3]  # some keys stay (with new values), the others must go
    rows = [(k, b"new-" + k, 1000 + i) for i, k in enumerate(keep)] + [(b"fresh-%d" % i, b"f", 7) for i in range(5)]
    df = spark.createDataFrame(rows, "key binary, value binary, timestamp bigint").repartition(3)
    df.write.format("kvlog").mode("overwrite").save(path)
    wanted = {k: v for k, v, _t in rows}
    assert _state(path) == wanted
    assert _replayed(path) == wanted  # changelog readers see the same state
    with kvlog.open(path, read_only=True) as store:
        assert store.log.version == version + 1, "the overwrite was not one commit"
        added = [r for r in store.changes() if r.offset >= ends[r.partition]]
    tombstones = sorted(r.key for r in added if r.value is None)
    assert tombstones == sorted(set(before) - set(wanted))
    assert sorted((r.key, r.value, r.timestamp_ms) for r in added if r.value is not None) == sorted(rows)
    name = commit_name(version + 1)
    commit = decode_commit(name, (Path(path) / name).read_bytes())
    assert commit.info["spark_overwrite"]["tombstones"] == len(tombstones)
    # view=log reads the tombstones too.
    log = spark.read.format("kvlog").load(path)
    assert log.where("is_tombstone").count() >= len(tombstones)
    latest = spark.read.format("kvlog").option("view", "latest").load(path)
    assert {bytes(r.key): bytes(r.value) for r in latest.collect()} == wanted
    # An empty DataFrame deletes every key.
    spark.createDataFrame([], "key binary, value binary").write.format("kvlog").mode("overwrite").save(path)
    assert _state(path) == {} and _replayed(path) == {}


def test_overwrite_refuses_a_key_twice_and_writes_nothing(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=60, keys=20, seed=22)
    version, on_disk, state = _snapshot(kv, path)
    twice = _df(spark, [("dup", "1"), ("x", "2"), ("dup", "3")])
    with pytest.raises(Exception, match="InvalidRecordError") as caught:
        twice.write.format("kvlog").mode("overwrite").save(path)
    assert "takes each key once" in str(caught.value) and "b'dup'" in str(caught.value)
    assert _snapshot(kv, path) == (version, on_disk, state)
    # Append keeps both: the later offset wins.
    spark.createDataFrame([("dup", "1"), ("dup", "3")], "key string, value string").coalesce(1) \
        .write.format("kvlog").mode("append").save(path)
    assert _state(path)[b"dup"] == b"3"


@pytest.mark.parametrize("mode", ["append", "overwrite", "errorifexists", "ignore"])
def test_bad_input_changes_nothing_in_any_mode(spark: Any, kv: Any, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=60, keys=20, seed=23)
    version, on_disk, state = _snapshot(kv, path)
    missing = tmp_path / "missing"
    bad_schema = spark.createDataFrame([("k",)], "key string")
    for target in (path, str(missing)):
        with pytest.raises(Exception, match="no 'value' column"):
            if mode in ("append", "overwrite"):
                bad_schema.write.format("kvlog").mode(mode).save(target)
            else:
                bad_schema.write.format("kvlog").mode("append").option("saveMode", mode).save(target)
    assert not missing.exists()
    assert _snapshot(kv, path) == (version, on_disk, state)
    # Rows refused by the tasks (a null key): tests/spark/test_write.py, append and overwrite.


def test_errorifexists_and_ignore(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    df = _df(spark, [("a", "1"), ("b", "2")])
    # Spark refuses both modes for every Python data source before kvlog runs; its message
    # names append and overwrite, which kvlog takes.
    for mode in ("errorifexists", "ignore"):
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE") as caught:
            df.write.format("kvlog").mode(mode).save(path)
        assert '"Append" or "Overwrite"' in str(caught.value)
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("kvlog").save(path)  # Spark's default mode
    assert not Path(path).exists()
    # spark_ext.save runs them: a missing store is created and written ...
    spark_ext.save(df, path, partitions=2)
    assert _state(path) == {b"a": b"1", b"b": b"2"}
    version, on_disk, state = _snapshot(kv, path)
    # ... an existing one is an error (errorifexists) or left alone (ignore), without a job.
    with pytest.raises(kvlog.ConfigError, match="already exists"):
        spark_ext.save(df, path)
    with pytest.raises(kvlog.ConfigError, match="already exists"):
        spark_ext.save(df, path, mode="error")
    marker = tmp_path / "a-task-ran"
    spark_ext.save(_touching(df, marker), path, mode="ignore")
    assert not marker.exists()
    assert _snapshot(kv, path) == (version, on_disk, state)
    # The writer checks again when the write is planned (a store created after the check).
    with pytest.raises(Exception, match="already exists"):
        df.write.format("kvlog").mode("append").option("saveMode", "errorifexists").save(path)
    df.write.format("kvlog").mode("append").option("saveMode", "ignore").save(path)
    assert _snapshot(kv, path) == (version, on_disk, state)
    spark_ext.save(_df(spark, [("c", "3")]), str(tmp_path / "other"), mode="ignore")
    assert _state(str(tmp_path / "other")) == {b"c": b"3"}
    spark_ext.save(_df(spark, [("a", "9")]), path, mode="overwrite")
    spark_ext.save(_df(spark, [("z", "0")]), path, mode="append")
    assert _state(path) == {b"a": b"9", b"z": b"0"}
    for bad in ("merge", "upsert"):
        with pytest.raises(kvlog.ConfigError, match="mode="):
            spark_ext.save(df, path, mode=bad)
    with pytest.raises(Exception, match="saveMode"):
        df.write.format("kvlog").mode("overwrite").option("saveMode", "ignore").save(path)


def _touching(df: Any, marker: Path) -> Any:
    marker_path = str(marker)

    def touch(batches: Any) -> Any:
        open(marker_path, "w").close()
        yield from batches

    return df.mapInArrow(touch, df.schema)


def test_catalog_tables_fail_clearly_and_temporary_views_work(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    spark_ext.register(spark)
    spark_ext.save(_df(spark, [("a", "1")]), path)
    with pytest.raises(Exception, match="CREATE TABLE ... USING kvlog is not supported"):
        spark.sql(f"CREATE TABLE kv_t USING kvlog OPTIONS (path '{path}')")
    assert not spark.catalog.tableExists("kv_t")
    # saveAsTable writes the store at its path, but the table Spark registers has no path.
    _df(spark, [("b", "2")]).write.format("kvlog").mode("append").option("path", path).saveAsTable("kv_saved")
    try:
        assert _state(path) == {b"a": b"1", b"b": b"2"}
        with pytest.raises(Exception, match="catalog table .*cannot be read or written"):
            spark.table("kv_saved").collect()
        with pytest.raises(Exception, match="catalog table .*cannot be read or written"):
            _df(spark, [("c", "3")]).write.insertInto("kv_saved")
    finally:
        spark.sql("DROP TABLE IF EXISTS kv_saved")
    assert _state(path) == {b"a": b"1", b"b": b"2"}
    # A temporary view keeps its options: it reads (writes go through df.write or spark_ext.save).
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW kv_view USING kvlog OPTIONS (path '{path}', view 'latest')")
    try:
        rows = spark.sql("SELECT CAST(key AS STRING) k, CAST(value AS STRING) v FROM kv_view ORDER BY k").collect()
        assert [(r.k, r.v) for r in rows] == [("a", "1"), ("b", "2")]
    finally:
        spark.catalog.dropTempView("kv_view")
