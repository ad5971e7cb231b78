"""The ``kvlog`` data source: views, filter pushdown, retroactive tombstones, bad input.

Every Spark result is compared with what the store itself says (``changes()``,
the dict model), computed without Spark.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import kvlog
import kvlog.log.append as append_module
import spark_ext
from kvlog.errors import ConfigError, StoreNotFoundError

pytestmark = pytest.mark.spark

LOG_COLUMNS = ["partition", "offset", "timestamp", "key", "value", "is_tombstone", "expires_ms"]
LATEST_COLUMNS = ["key", "value", "partition", "offset", "timestamp", "expires_ms"]


def read(spark: Any, uri: str, **options: str) -> Any:
    reader = spark.read.format("kvlog")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(uri)


def expected_log(kv: Any, store: kvlog.Store) -> list[tuple[Any, ...]]:
    return [(p, o, t, k, v, v is None, None) for p, o, t, k, v in kv.log_rows(store)]


def latest_of(kv: Any, store: kvlog.Store) -> dict[bytes, tuple[bytes, int, int, int]]:
    """key -> (value, partition, offset, timestamp) of every live key, from the changelog."""
    out: dict[bytes, tuple[bytes, int, int, int]] = {}
    for p, o, t, k, v in kv.log_rows(store):
        if v is None:
            out.pop(k, None)
        else:
            out[k] = (v, p, o, t)
    return out


def test_log_view_equals_changes(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=1200, keys=150, seed=1)
        df = read(spark, path)
        assert df.columns == LOG_COLUMNS
        assert [f.dataType.simpleString() for f in df.schema.fields] == [
            "int", "bigint", "bigint", "binary", "binary", "boolean", "bigint"]
        got = sorted(kv.table_rows(df.toArrow(), LOG_COLUMNS))
        want = expected_log(kv, store)
        assert len(want) == 1200
        assert any(row[5] for row in want)
        assert got == want
        # The read changed nothing the open store relies on.
        assert store.check() == []


def test_latest_view_matches_the_model_after_deletes_and_local_compaction(
        spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        model = kv.fill(store, ops=1500, keys=120, seed=2, delete_every=5)

        def check_latest() -> None:
            table = read(spark, path, view="latest").toArrow()
            assert table.column_names == LATEST_COLUMNS
            rows = kv.table_rows(table, LATEST_COLUMNS)
            assert len(rows) == len({r[0] for r in rows}), "a key appears twice in view=latest"
            assert {r[0]: r[1] for r in rows} == model
            assert {r[0]: (r[1], r[2], r[3], r[4]) for r in rows} == latest_of(kv, store)

        check_latest()
        report = store.compact(force=True)
        assert report.rounds == 1 and report.records_removed > 0
        # Compaction left holes: batches whose present offsets are a bitmap.
        assert any(b.present is not None for b in kv.live_batches(store))
        check_latest()
        # More writes and deletes on top of the compacted log, then both views once more.
        for i in range(0, 120, 3):
            store.delete(b"key-%05d" % i)
            model.pop(b"key-%05d" % i, None)
        kv.fill(store, ops=300, keys=200, seed=3, model=model)
        check_latest()
        got = sorted(kv.table_rows(read(spark, path).toArrow(), LOG_COLUMNS))
        assert got == expected_log(kv, store)
        assert store.check() == []


#: A filter the reader takes over shows in the plan only as ``isnotnull(...)``; one it does
#: not take stays as a comparison in Spark's Filter node.
_UNPUSHED = re.compile(r"\b(partition|offset)#\d+L? (=|<|>|<=|>=|IN) ")


def _plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def test_partition_and_offset_pushdown(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        kv.fill(store, ops=800, keys=60, seed=4)
        store.compact(force=True)
        kv.fill(store, ops=400, keys=400, seed=5)
        everything = kv.log_rows(store)
        assert any(b.present is not None for b in kv.live_batches(store))
    queries = {
        "partition = 1": lambda p, o: p == 1,
        "partition IN (0, 2)": lambda p, o: p in (0, 2),
        "offset >= 40 AND offset < 150": lambda p, o: 40 <= o < 150,
        "offset > 40 AND offset <= 150 AND partition = 3": lambda p, o: 40 < o <= 150 and p == 3,
        "partition IN (1, 3) AND offset > 200": lambda p, o: p in (1, 3) and o > 200,
        "offset <= 120": lambda p, o: o <= 120,
    }
    from pyspark.sql import functions as F

    frames = []
    for number, condition in enumerate(queries):
        df = read(spark, path).where(condition)
        plan = _plan(df)
        assert "BatchScan kvlog" in plan
        assert not _UNPUSHED.search(plan), f"{condition!r} was not pushed down:\n{plan}"
        frames.append(df.withColumn("query", F.lit(number)))
    # view=latest prunes partitions too; an offset filter it cannot prune by (a key's newer
    # batches would be dropped) stays with Spark, and both answers are right.
    latest = read(spark, path, view="latest").where("partition = 1")
    assert not _UNPUSHED.search(_plan(latest))
    latest_offsets = read(spark, path, view="latest").where("offset > 100")
    assert _UNPUSHED.search(_plan(latest_offsets))
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = kv.table_rows(union.toArrow(), ["query", *LOG_COLUMNS[:5]])
    for number, (condition, keep) in enumerate(queries.items()):
        got = sorted(r[1:] for r in rows if r[0] == number)
        want = [r for r in everything if keep(r[0], r[1])]
        assert want, condition
        assert got == want, condition
    with kv.open_store(path, read_only=True) as store:
        want_latest = {k: v for k, (v, p, _o, _t) in latest_of(kv, store).items() if p == 1}
        want_late = {k: v for k, (v, _p, o, _t) in latest_of(kv, store).items() if o > 100}
    assert {bytes(r["key"]): bytes(r["value"]) for r in latest.collect()} == want_latest
    assert {bytes(r["key"]): bytes(r["value"]) for r in latest_offsets.collect()} == want_late


def test_a_resent_duplicate_batch_is_never_read(spark: Any, kv: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A resent append whose batch reached a data file and a commit is retroactively tombstoned."""
    path = str(tmp_path / "store")
    # data files of their own: the test counts the data file the resent batch is written to
    with kv.open_store(path, commit_inline_bytes=0) as store:
        kv.fill(store, ops=200, keys=50, seed=6)
        the_log = store.log
        keys = [k for k in (b"dup-%03d" % i for i in range(200)) if the_log.partition_for(k) == 2][:5]
        records = [(k, b"once") for k in keys]
        producer = the_log.producer()
        first = producer.append(2, records, base_sequence=0)
        files_before = kv.data_files_on_disk(path)
        # The resend misses the early duplicate check (as after a lost acknowledgement in
        # another process): its batch is written to a new data file and committed.
        monkeypatch.setattr(append_module, "_known_duplicates", lambda *args, **kwargs: None)
        again = producer.append(2, records, base_sequence=0)
        assert again.duplicate and (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset)
        new_files = kv.data_files_on_disk(path) - files_before
        assert len(new_files) == 1, "the resent batch was not written to a data file"
        assert not new_files & kv.live_files(store)
        want = expected_log(kv, store)
    rows = kv.table_rows(read(spark, path).where("partition = 2").toArrow(), LOG_COLUMNS)
    assert sorted(rows) == [r for r in want if r[0] == 2]
    assert sorted(r[3] for r in rows if r[3] in keys) == sorted(keys)
    latest = kv.table_rows(read(spark, path, view="latest").toArrow(), LATEST_COLUMNS)
    assert sorted(r[0] for r in latest if r[0] in keys) == sorted(keys)


# -- bad input -----------------------------------------------------------------------------------

def test_a_missing_store_is_store_not_found(spark: Any, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-store")
    with pytest.raises(StoreNotFoundError):
        spark_ext.compact(spark, missing)
    with pytest.raises(StoreNotFoundError):
        spark_ext.materialize(spark, missing, str(tmp_path / "out"))
    with pytest.raises(StoreNotFoundError):
        spark_ext.rebuild_index(spark, missing, tmp_path / "cache")
    with pytest.raises(Exception, match="StoreNotFoundError"):
        read(spark, missing).collect()
    assert not os.path.exists(missing)


def test_a_wrong_uri_scheme_is_a_config_error(spark: Any, tmp_path: Path) -> None:
    for uri in ("ftp://host/store", "gs://bucket/store"):
        with pytest.raises(ConfigError, match="scheme"):
            spark_ext.compact(spark, uri)
        with pytest.raises(ConfigError, match="scheme"):
            spark_ext.materialize(spark, uri, str(tmp_path / "out"))
        with pytest.raises(ConfigError, match="scheme"):
            spark_ext.rebuild_index(spark, uri, tmp_path / "cache")


def test_an_unknown_view_is_refused(spark: Any, kv: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kv.open_store(path) as store:
        store.put("k", "v", sync=True)
    with pytest.raises(Exception, match="view='changes'"):
        read(spark, path, view="changes").collect()


def test_without_java_check_java_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-java"
    (empty / "bin").mkdir(parents=True)
    python_only = tmp_path / "path"
    python_only.mkdir()
    monkeypatch.setenv("JAVA_HOME", str(empty))
    monkeypatch.setenv("PATH", str(python_only))
    assert shutil.which("java") is None
    with pytest.raises(ConfigError, match="Java 17"):
        spark_ext.check_java()
    with pytest.raises(ConfigError, match="Java 17"):
        spark_ext.get_session()
    monkeypatch.delenv("JAVA_HOME")
    with pytest.raises(ConfigError, match="Java 17"):
        spark_ext.check_java()
    monkeypatch.undo()
    spark_ext.check_java()  # the environment is back: Java is found again
